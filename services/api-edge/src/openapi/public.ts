// The public port's OpenAPI 3.1 document: one operation per route api-edge registers (the route
// table, packages/proto/src/routes.ts), each request body converted from the zod schema the
// route validates with, the prose below, and on the paid route the MPP discovery extension
// `x-payment-info` built from the configured plans and prices.

import { ROUTE_IDS, ROUTES, type RouteId, type RouteSpec } from "@tollgate/proto/routes";
import { z } from "zod";
import { requestSchemas } from "../schemas/requests.js";
import { responseObjectSchema } from "../schemas/responses.js";
import { thinkResponseSchema } from "../schemas/think.js";
import {
  addOperation,
  errorCodes,
  errorSchema,
  jsonBody,
  jsonResponse,
  jsonSchemaOf,
  type OpenApiDocument,
  openApiDocument,
  type PathItem,
  pathParameters,
} from "./document.js";
import { type PaidOffer, paymentInfo } from "./payment-info.js";

/** How one route's operation reads and what it answers when it succeeds: the one place of its prose. */
interface RouteDoc {
  operationId: string;
  summary: string;
  description?: string;
  /** Its success answers by status (its errors follow its door: errorOf). */
  answers: Record<string, unknown>;
}

/** Every route's operation: a route added to the table and not here does not compile. */
const ROUTE_DOCS: Record<RouteId, RouteDoc> = {
  models: {
    operationId: "listModels",
    summary: "The models the key's connection may use (operation `models`)",
    answers: { "200": jsonResponse("A list of models.", "ModelList") },
  },
  model: {
    operationId: "retrieveModel",
    summary: "One model the key's connection may use (operation `models`)",
    answers: { "200": jsonResponse("The model.", "Model") },
  },
  chat: {
    operationId: "createChatCompletion",
    summary: "OpenAI Chat Completions, buffered or streamed (operation `chat`)",
    description: "`n` choices are priced into the quote (docs/spend.md).",
    answers: { "200": streamOrJson("JsonObject") },
  },
  completions: {
    operationId: "createCompletion",
    summary: "OpenAI legacy Completions, buffered or streamed (operation `completions`)",
    description: "One choice per prompt; every prompt and choice is priced into the quote.",
    answers: { "200": streamOrJson("JsonObject") },
  },
  responses: {
    operationId: "createResponse",
    summary:
      "OpenAI Responses (text subset), buffered or streamed as the Responses event sequence (operation `responses`)",
    description:
      "Each answer's output message is kept (unless `store: false`) for later `item_reference` inputs; whole responses are not, so `previous_response_id` is refused with 400, and so are `conversation` and `prompt` (state OpenAI keeps: a conversation's items, a stored prompt) and a non-empty `tools` (call chat completions for tools). `text.format` `json_object` or `json_schema` asks the model for JSON (the chat `response_format`); the answer echoes `text.format` and `metadata`.",
    answers: { "200": streamOrJson("Response") },
  },
  messages: {
    operationId: "createMessage",
    summary: "Anthropic Messages (text subset), buffered or streamed (operation `chat`)",
    description: "Tools, tool results, images, documents and extended thinking are refused with 400.",
    answers: { "200": streamOrJson("JsonObject") },
  },
  think: {
    operationId: "think",
    summary: "A reasoning model's answer, buffered (operation `think`)",
    description:
      "Give `messages` or `prompt`, not both. A model configured without reasoning is a 400 `model_cannot_reason`.",
    answers: { "200": jsonResponse("The answer.", "ThinkResponse") },
  },
  embeddings: {
    operationId: "createEmbedding",
    summary: "Embeddings of one or more inputs, priced per input token (operation `embeddings`)",
    answers: { "200": jsonResponse("The embeddings, in input order, with usage.", "JsonObject") },
  },
  mppChat: {
    operationId: "createPaidChatCompletion",
    summary: "The paid door: a chat completion paid per request over MPP (no key)",
    description:
      "The body names a `plan` and either `model_optimization: true` or a `model`, and an explicit " +
      "`max_tokens` (or `max_completion_tokens`). Without a payment credential the answer is 402 with " +
      "`WWW-Authenticate: Payment …`; a paid request carries `Authorization: Payment …` and is answered " +
      "with a `Payment-Receipt`. `x-payment-info` lists the plans, their models and prices (docs/paid-door.md).",
    answers: {
      "200": {
        description: "The completion, with a Payment-Receipt header.",
        headers: { "Payment-Receipt": { schema: { type: "string" } } },
        content: { "application/json": { schema: { $ref: "#/components/schemas/JsonObject" } } },
      },
      "402": {
        description: "Payment required; the challenge is in WWW-Authenticate.",
        headers: { "WWW-Authenticate": { schema: { type: "string" } } },
        content: { "application/problem+json": { schema: { $ref: "#/components/schemas/Problem" } } },
      },
    },
  },
  livez: {
    operationId: "livez",
    summary: "Liveness probe",
    answers: { "200": { description: "The process is alive." } },
  },
  readyz: {
    operationId: "readyz",
    summary: "Readiness probe (the gRPC channels, Redis, not draining)",
    answers: { "200": { description: "Ready to serve." }, "503": { description: "Not ready." } },
  },
  openapi: {
    operationId: "getOpenApi",
    summary: "This document (no key; never billed or rate limited)",
    answers: {
      "200": {
        description: "This document.",
        content: { "application/json": { schema: { type: "object" } } },
      },
    },
  },
};

const DESCRIPTION = `The public port of api-edge (default 127.0.0.1:8080). Two doors: the account door takes a
Virtual Key (\`Authorization: Bearer tg_…\`; \`x-api-key\` on \`/v1/messages\`), the paid door takes no
key and answers an unpaid request with 402 and an MPP challenge. Bodies are JSON; \`stream: true\`
answers as server-sent events where a route streams. Every error is
\`{ "error": { "message", "type", "code", "request_id" } }\` (Anthropic's error shape on
\`/v1/messages\`, RFC 9457 problem details on the paid door); \`code\` is one of \`ErrorCode\`. A known
path called with another method answers 405 \`method_not_allowed\` with an \`Allow\` header. Money is
in base units of the payment token (6 decimals), as decimal strings. Generated from the route table
and the request schemas (services/api-edge/src/openapi/); reference: docs/contract.md.
`;

const modelSchema = z.object({
  id: z.string(),
  object: z.literal("model"),
  created: z.number().int(),
  owned_by: z.string(),
  pricing: z
    .object({
      input_per_million: z.string().describe("Base units of the payment token per million input tokens"),
      output_per_million: z.string().describe("Base units of the payment token per million output tokens"),
      currency_decimals: z.literal(6),
    })
    .optional(),
});

/** Response shapes of the public port, by component name. */
function responseSchemas(): OpenApiDocument["components"]["schemas"] {
  const errorCode = z.enum(errorCodes(["account", "paid"]) as [string, ...string[]]);
  const error = errorSchema(z.string());
  return {
    ErrorCode: {
      ...jsonSchemaOf(errorCode),
      description: "Every code the public doors answer (packages/proto/src/errors.ts).",
    },
    Error: refCode(jsonSchemaOf(error)),
    Problem: {
      ...jsonSchemaOf(
        z.looseObject({
          type: z.string(),
          title: z.string(),
          status: z.number().int(),
          detail: z.string(),
          code: z.string(),
          request_id: z.string(),
          challengeId: z.string().optional(),
          error: error.shape.error,
        }),
      ),
      description: "The paid door's errors: RFC 9457 problem details with the error object beside them.",
    },
    AnthropicError: refCode(
      jsonSchemaOf(
        z.object({
          type: z.literal("error"),
          error: z.object({ type: z.string(), message: z.string(), code: z.string() }),
          request_id: z.string(),
        }),
      ),
    ),
    Model: jsonSchemaOf(modelSchema),
    ModelList: jsonSchemaOf(z.object({ object: z.literal("list"), data: z.array(modelSchema) })),
    JsonObject: { type: "object", additionalProperties: true },
    Response: jsonSchemaOf(responseObjectSchema),
    ThinkResponse: jsonSchemaOf(thinkResponseSchema),
  };
}

/** The error object's `code` as a reference to ErrorCode: one list of codes for every error body. */
function refCode(schema: Record<string, unknown>): Record<string, unknown> {
  const error = (schema["properties"] as Record<string, Record<string, unknown>>)["error"]!;
  const props = error["properties"] as Record<string, unknown>;
  props["code"] = { $ref: "#/components/schemas/ErrorCode" };
  return schema;
}

/** A route's error answer: the OpenAI-style error; Anthropic's shape on Messages; problem details on the paid door. */
function errorOf(id: RouteId, spec: RouteSpec): Record<string, unknown> {
  const body = (type: string, schema: string, description: string) => ({
    default: { description, content: { [type]: { schema: { $ref: `#/components/schemas/${schema}` } } } },
  });
  if (spec.door === "paid") return body("application/problem+json", "Problem", "An error; `code` names it.");
  if (id === "messages") {
    return body(
      "application/json",
      "AnthropicError",
      "An error in Anthropic's shape; `error.code` names it.",
    );
  }
  return { default: { $ref: "#/components/responses/Error" } };
}

function streamOrJson(schema: string): unknown {
  return {
    description: "The answer, as JSON or, with `stream: true`, as server-sent events.",
    content: {
      "application/json": { schema: { $ref: `#/components/schemas/${schema}` } },
      "text/event-stream": { schema: { type: "string" } },
    },
  };
}

/** Who may call a route, as OpenAPI security requirements (absent: the document's, a Virtual Key). */
function securityOf(id: RouteId, spec: RouteSpec): Record<string, string[]>[] | undefined {
  if (spec.door === "public") return [];
  if (spec.door === "paid") return [{}, { payment: [] }];
  if (id === "messages") return [{ anthropicKey: [] }, { virtualKey: [] }];
  return undefined;
}

/** What the public document is built from: the running configuration's. */
export interface PublicDocumentOptions {
  /** The routes api-edge registers (the paid route only when the paid door is on). */
  routes: readonly RouteId[];
  /** The configured message limit (MAX_MESSAGES), which the request schemas carry. */
  maxMessages: number;
  /** The paid door's plans and prices; absent: `x-payment-info` lists none. */
  offer?: PaidOffer;
}

/** The public port's OpenAPI 3.1 document. */
export function publicDocument(opts: PublicDocumentOptions): OpenApiDocument {
  const schemas = requestSchemas(opts.maxMessages);
  const paths: Record<string, PathItem> = {};
  for (const id of ROUTE_IDS.filter((r) => opts.routes.includes(r))) {
    const spec: RouteSpec = ROUTES[id];
    const { answers, ...doc } = ROUTE_DOCS[id];
    const security = securityOf(id, spec);
    // Every account-door POST takes an Idempotency-Key (the guard of routes/account-inference.ts).
    const idempotent = spec.door === "account" && spec.method === "POST";
    const params = [
      ...pathParameters(spec.path),
      ...(idempotent ? [{ $ref: "#/components/parameters/IdempotencyKey" }] : []),
    ];
    addOperation(paths, spec.method, spec.path, {
      ...doc,
      tags: [spec.door],
      ...(security ? { security } : {}),
      ...(params.length > 0 ? { parameters: params } : {}),
      ...(spec.schema ? { requestBody: jsonBody(schemas[spec.schema]) } : {}),
      responses: { ...answers, ...errorOf(id, spec) },
      ...(spec.door === "paid" ? { "x-payment-info": paymentInfo(opts.offer) } : {}),
    });
  }
  return openApiDocument({
    title: "Tollgate public API",
    description: DESCRIPTION,
    security: [{ virtualKey: [] }],
    paths,
    components: {
      securitySchemes: {
        virtualKey: {
          type: "http",
          scheme: "bearer",
          description: "A Virtual Key, `tg_` and 40 base62 characters.",
        },
        anthropicKey: {
          type: "apiKey",
          in: "header",
          name: "x-api-key",
          description: "A Virtual Key (Anthropic's SDKs).",
        },
        payment: {
          type: "apiKey",
          in: "header",
          name: "Authorization",
          description: "`Payment <credential>`, an MPP session credential answering a challenge.",
        },
      },
      parameters: {
        IdempotencyKey: {
          name: "Idempotency-Key",
          in: "header",
          required: false,
          description:
            "A retried request with the same key and body gets the first answer (buffered requests only).",
          schema: { type: "string", maxLength: 255 },
        },
      },
      schemas: responseSchemas(),
    },
  });
}
