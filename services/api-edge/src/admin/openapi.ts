// The admin API's OpenAPI 3.1 document: one operation per route the admin server registers
// (server.ts), request bodies and queries converted from the zod schemas mapping.ts parses them
// with, answers from the shapes below (checked against mapping.ts's output at compile time),
// and each operation's prose, here and nowhere else.

import { OPERATION_NAMES } from "@tollgate/proto/routes";
import { z } from "zod";
import {
  addOperation,
  errorCodes,
  errorSchema,
  jsonBody,
  jsonSchemaOf,
  type NamedSchemas,
  type OpenApiDocument,
  openApiDocument,
  type PathItem,
  pathParameters,
} from "../openapi/document.js";
import {
  type accountJson,
  type connectionJson,
  createAccountBody,
  createConnectionBody,
  createKeyBody,
  type keyJson,
  listKeysQuery,
  rotateKeyBody,
  updateAccountBody,
  updateConnectionBody,
  updateKeyBody,
  type usageJson,
  usageQuery,
} from "./mapping.js";

// ---------------------------------------------------------------------------------------------
// Answers

const time = z.string().nullable().describe("ISO 8601, UTC");
const money = z.string().describe("Base units of the payment token (6 decimals), a decimal string");
const limits = z.object({
  requests_per_minute: z.number().int().nullable(),
  tokens_per_minute: z.number().int().nullable(),
});
const budget = z
  .union([
    z.object({ amount: money, period: z.string() }),
    z.object({ amount: money, period_days: z.number().int() }),
  ])
  .nullable();
const budgetUsage = z
  .object({ spent: money, held: money, remaining: money, period_start: time, period_end: time })
  .describe("The budget's current period; shown for one connection or key when a budget applies")
  .optional();

/** The answers' entities, each a named component of the document. */
const NAMED = z.registry<{ id: string }>();

const account = z
  .object({ id: z.string(), object: z.string(), limits, created_at: time })
  .register(NAMED, { id: "Account" });

const connection = z
  .object({
    id: z.string(),
    object: z.string(),
    account_id: z.string(),
    models: z.array(z.string()),
    default_model: z.string(),
    default_max_output_tokens: z.number().int(),
    max_output_tokens: z.number().int(),
    routes: z.array(z.enum(OPERATION_NAMES)).nullable().describe("null: every route"),
    limits: limits.extend({
      key_requests_per_minute: z.number().int().nullable(),
      key_tokens_per_minute: z.number().int().nullable(),
      routes: z.partialRecord(z.enum(OPERATION_NAMES), limits),
    }),
    budget,
    budget_usage: budgetUsage,
    created_at: time,
  })
  .register(NAMED, { id: "Connection" });

const key = z
  .object({
    id: z.string(),
    object: z.string(),
    account_id: z.string(),
    connection_id: z.string(),
    name: z.string(),
    state: z.string().describe("active, rotating, rotated, expired or revoked"),
    last4: z.string(),
    created_at: time,
    expires_at: time,
    revoked_at: time,
    rotated_from: z.string().nullable(),
    rotated_to: z.string().nullable(),
    grace_ends_at: time,
    budget,
    budget_usage: budgetUsage,
  })
  .register(NAMED, { id: "Key" });

const totals = z
  .object({
    requests: z.number().int(),
    input_tokens: z.number().int(),
    output_tokens: z.number().int(),
    reasoning_tokens: z.number().int(),
    cost: money,
  })
  .register(NAMED, { id: "Totals" });

const usage = z.object({
  object: z.string(),
  granularity: z.string().describe("hour or day"),
  group_by: z.string().optional().describe("model, when asked with group_by=model"),
  totals,
  buckets: z.array(
    totals.extend({
      start: time,
      model: z.string().optional().describe("With group_by=model: the bucket's model"),
    }),
  ),
});

// mapping.ts's output must be what these shapes describe: a field of another type there, or a
// top-level field there and not here, does not compile.
type Fits<Actual extends Expected & Record<Exclude<keyof Actual, keyof Expected>, never>, Expected> = Actual;
export type AdminAnswerShapes = [
  Fits<ReturnType<typeof accountJson>, z.input<typeof account>>,
  Fits<ReturnType<typeof connectionJson>, z.input<typeof connection>>,
  Fits<ReturnType<typeof keyJson>, z.input<typeof key>>,
  Fits<ReturnType<typeof usageJson>, z.input<typeof usage>>,
];

const list = (item: z.ZodType) => z.object({ object: z.literal("list"), data: z.array(item) });
const deleted = z.object({
  id: z.string(),
  object: z.string(),
  account_id: z.string().optional(),
  deleted: z.literal(true),
  revoked_keys: z.array(key),
});

// ---------------------------------------------------------------------------------------------
// Operations

interface AdminOperation {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  /** As fastify spells it (server.ts registers exactly these). */
  path: string;
  summary: string;
  description?: string;
  body?: z.ZodType;
  query?: z.ZodObject;
  status: 200 | 201;
  answer: z.ZodType;
  answerDescription: string;
}

const ACCOUNTS = "/admin/v1/accounts";
const ACCOUNT = `${ACCOUNTS}/:accountId`;
const CONNECTIONS = `${ACCOUNT}/connections`;
const CONNECTION = `${CONNECTIONS}/:connectionId`;
const KEY = "/admin/v1/keys/:keyId";

/** Every admin route, by operationId: its method and path, prose, body or query, and answer. */
export const ADMIN_OPERATIONS = {
  createAccount: {
    method: "POST",
    path: ACCOUNTS,
    summary: "Create an account",
    body: createAccountBody,
    status: 201,
    answer: account,
    answerDescription: "The account.",
  },
  listAccounts: {
    method: "GET",
    path: ACCOUNTS,
    summary: "Every account, ordered by id",
    status: 200,
    answer: list(account),
    answerDescription: "The accounts.",
  },
  getAccount: {
    method: "GET",
    path: ACCOUNT,
    summary: "One account and its connections",
    status: 200,
    answer: account.extend({ connections: z.array(connection) }),
    answerDescription: "The account and its connections.",
  },
  updateAccount: {
    method: "PATCH",
    path: ACCOUNT,
    summary: "Replace the account's limits",
    body: updateAccountBody,
    status: 200,
    answer: account,
    answerDescription: "The account.",
  },
  deleteAccount: {
    method: "DELETE",
    path: ACCOUNT,
    summary: "Delete an account",
    description:
      "Revokes every key of the account (broadcast to every replica), then removes its connections and the account.",
    status: 200,
    answer: deleted,
    answerDescription: "What was deleted and the keys it revoked.",
  },
  createConnection: {
    method: "POST",
    path: CONNECTIONS,
    summary: "Create a connection of the account",
    body: createConnectionBody,
    status: 201,
    answer: connection,
    answerDescription: "The connection.",
  },
  listConnections: {
    method: "GET",
    path: CONNECTIONS,
    summary: "The account's connections, ordered by id",
    status: 200,
    answer: list(connection),
    answerDescription: "The connections.",
  },
  getConnection: {
    method: "GET",
    path: CONNECTION,
    summary: "One connection, with its budget's current period",
    status: 200,
    answer: connection,
    answerDescription: "The connection.",
  },
  updateConnection: {
    method: "PATCH",
    path: CONNECTION,
    summary: "Set or clear the connection's budget, replace its limits",
    description:
      "A budget object sets the budget, null clears it, absent keeps it; limits, when given, replace the connection's limits. A budget keeps its period: one of another period is refused (409 budget_period_change), as the new period would count from zero; clear the budget first to start afresh.",
    body: updateConnectionBody,
    status: 200,
    answer: connection,
    answerDescription: "The connection.",
  },
  deleteConnection: {
    method: "DELETE",
    path: CONNECTION,
    summary: "Delete a connection",
    description: "Revokes every key of the connection (broadcast to every replica), then removes it.",
    status: 200,
    answer: deleted,
    answerDescription: "What was deleted and the keys it revoked.",
  },
  createKey: {
    method: "POST",
    path: `${CONNECTION}/keys`,
    summary: "Create a Virtual Key on the connection",
    body: createKeyBody,
    status: 201,
    answer: z.object({ key, secret: z.string().describe("The key itself, shown this once and never again") }),
    answerDescription: "The key and its secret, shown this once.",
  },
  listKeys: {
    method: "GET",
    path: `${ACCOUNT}/keys`,
    summary: "The account's keys (of one connection with `connection`), oldest first",
    query: listKeysQuery,
    status: 200,
    answer: list(key),
    answerDescription: "The keys, never their secrets.",
  },
  getKey: {
    method: "GET",
    path: KEY,
    summary: "One key, with its budget's current period",
    status: 200,
    answer: key,
    answerDescription: "The key.",
  },
  updateKey: {
    method: "PATCH",
    path: KEY,
    summary: "Set or clear the key's own budget",
    description:
      "A budget object sets the key's own budget, null clears it. A budget keeps its period: one of another period is refused (409 budget_period_change); clear it first to start afresh.",
    body: updateKeyBody,
    status: 200,
    answer: key,
    answerDescription: "The key.",
  },
  revokeKey: {
    method: "POST",
    path: `${KEY}/revoke`,
    summary: "Revoke a key",
    description: "Idempotent; the first revocation time stays. 503 broadcast_failed asks for a retry.",
    status: 200,
    answer: z.object({ key }),
    answerDescription: "The revoked key.",
  },
  rotateKey: {
    method: "POST",
    path: `${KEY}/rotate`,
    summary: "Rotate a key: a new key, the old one valid for a grace period",
    body: rotateKeyBody,
    status: 201,
    answer: z.object({ old_key: key, new_key: key, secret: z.string() }),
    answerDescription: "The old key (rotating or rotated), the new key and its secret, shown this once.",
  },
  getUsage: {
    method: "GET",
    path: "/admin/v1/usage",
    summary: "Usage and cost over a time range, by account, connection, key or model",
    description: "`group_by=model`: one bucket per model and period, each naming its model.",
    query: usageQuery,
    status: 200,
    answer: usage,
    answerDescription:
      "Totals over the range and one bucket per hour or day (and model, with group_by=model) that saw usage.",
  },
  getOpenApi: {
    method: "GET",
    path: "/admin/v1/openapi.json",
    summary: "This document (behind the admin token, like every admin route)",
    status: 200,
    answer: z.object({ openapi: z.string() }),
    answerDescription: "This document.",
  },
} as const satisfies Record<string, AdminOperation>;

export type AdminOperationId = keyof typeof ADMIN_OPERATIONS;

const DESCRIPTION = `api-edge's admin port (default 127.0.0.1:8081), served only when ADMIN_TOKEN is set; the
public port never routes /admin. Every request, unknown paths and this document included, needs
\`Authorization: Bearer <ADMIN_TOKEN>\`. Bodies are JSON, times ISO 8601, money a decimal string of
base units (6 decimals). Every answer carries \`Cache-Control: no-store\`. \`tollgatectl\` is its
command-line client (packages/tollgatectl/README.md). Generated from the admin server's schemas
(services/api-edge/src/admin/openapi.ts).
`;

/** A query's fields as OpenAPI query parameters. */
function queryParameters(query: z.ZodObject): unknown[] {
  const schema = jsonSchemaOf(query) as { properties: Record<string, unknown> };
  return Object.entries(schema.properties).map(([name, s]) => ({
    name,
    in: "query",
    required: false,
    schema: s,
  }));
}

/** The admin API's OpenAPI 3.1 document. */
export function adminDocument(): OpenApiDocument {
  const paths: Record<string, PathItem> = {};
  const named: NamedSchemas = { registry: NAMED, schemas: {} };
  for (const [operationId, spec] of Object.entries(ADMIN_OPERATIONS) as [string, AdminOperation][]) {
    const params = [...pathParameters(spec.path), ...(spec.query ? queryParameters(spec.query) : [])];
    addOperation(paths, spec.method, spec.path, {
      operationId,
      summary: spec.summary,
      ...(spec.description ? { description: spec.description } : {}),
      ...(params.length > 0 ? { parameters: params } : {}),
      ...(spec.body ? { requestBody: jsonBody(spec.body) } : {}),
      responses: {
        [String(spec.status)]: {
          description: spec.answerDescription,
          content: { "application/json": { schema: jsonSchemaOf(spec.answer, named) } },
        },
        default: { $ref: "#/components/responses/Error" },
      },
    });
  }
  return openApiDocument({
    title: "Tollgate admin API",
    description: DESCRIPTION,
    security: [{ adminToken: [] }],
    paths,
    components: {
      securitySchemes: {
        adminToken: {
          type: "http",
          scheme: "bearer",
          description: "The ADMIN_TOKEN api-edge was started with.",
        },
      },
      schemas: {
        ...named.schemas,
        Error: jsonSchemaOf(errorSchema(z.enum(errorCodes(["admin"]) as [string, ...string[]]))),
        RouteName: { ...jsonSchemaOf(z.enum(OPERATION_NAMES)), description: "The account-door operations." },
      },
    },
  });
}
