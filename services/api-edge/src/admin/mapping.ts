// The admin API's HTTP contract (JSON, snake_case, ISO 8601 times, money as decimal strings of
// base units) and its mapping to and from the auth-policy and metering messages. Pure: no
// fastify, no gRPC client; the server only wires these to routes.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { type Timestamp, timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { describeIssues } from "@tollgate/kit/config";
import {
  type Account,
  type Budget,
  BudgetPeriod,
  type BudgetSchema,
  type BudgetUsage,
  type Connection,
  type CreateAccountRequestSchema,
  type CreateConnectionRequestSchema,
  type CreateKeyRequestSchema,
  type KeyInfo,
  KeyState,
  type RateLimits as RateLimitsMsg,
  type RateLimitsSchema,
  type RotateKeyRequestSchema,
  type UpdateAccountRequestSchema,
  type UpdateConnectionRequestSchema,
  type UpdateKeyRequestSchema,
} from "@tollgate/proto/auth";
import {
  type GetUsageRequestSchema,
  type GetUsageResponse,
  Granularity,
  type UsageTotals,
} from "@tollgate/proto/metering";
import { OPERATION_NAMES, OPERATIONS, type OperationName, operationOf } from "@tollgate/proto/routes";
import { z } from "zod";
import { AdminError } from "./errors.js";

const UINT32_MAX = 4_294_967_295;
/** auth-policy's longest rotation grace (30 days). */
const MAX_GRACE_SECONDS = 30 * 24 * 3_600;

/** Route names as the configuration file spells them. */
const ROUTE_BY_NAME = OPERATIONS;
type RouteName = OperationName;
const ROUTE_NAMES = OPERATION_NAMES;

const STATE_NAME = {
  [KeyState.UNSPECIFIED]: "unknown",
  [KeyState.ACTIVE]: "active",
  [KeyState.ROTATING]: "rotating",
  [KeyState.ROTATED]: "rotated",
  [KeyState.EXPIRED]: "expired",
  [KeyState.REVOKED]: "revoked",
} satisfies Record<KeyState, string>;

const GRANULARITY = { hour: Granularity.HOUR, day: Granularity.DAY } as const;

// ---------------------------------------------------------------------------------------------
// Requests

const perMinute = z.number().int().min(1).max(UINT32_MAX);
const outputCap = z.number().int().min(1).max(UINT32_MAX);
/** An ISO 8601 date-time with a zone (Z or an offset), or a plain date (midnight UTC). */
const isoTime = z
  .string()
  .regex(
    /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2}))?$/,
    "must be an ISO 8601 time such as 2030-01-31T12:00:00Z",
  )
  .transform((s, ctx) => {
    const d = new Date(s);
    const [y, m, day] = s.slice(0, 10).split("-").map(Number) as [number, number, number];
    const calendar = new Date(Date.UTC(y, m - 1, day));
    // Date rolls 2030-02-31 over into March; a typo must not become another day.
    if (Number.isNaN(d.getTime()) || calendar.getUTCMonth() !== m - 1 || calendar.getUTCDate() !== day) {
      ctx.addIssue({ code: "custom", message: "is not a valid time" });
      return z.NEVER;
    }
    return d;
  });

const rateLimitsBody = z.strictObject({
  requests_per_minute: perMinute.optional(),
  tokens_per_minute: perMinute.optional(),
});

/**
 * A spend cap per period, in base units (a decimal string or a safe integer); a string's leading
 * zeros are read as the number they write ("000500" is 500), as docs/openapi/admin.yaml allows.
 */
const budgetBody = z.strictObject({
  amount: z
    .union([z.string().regex(/^\d+$/), z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER)])
    .transform((a) => BigInt(a).toString()),
  period: z.enum(["month", "week", "day"]).optional(),
  period_days: z.number().int().positive().max(366).optional(),
});

function budgetIn(
  b: z.output<typeof budgetBody> | undefined,
): MessageInitShape<typeof BudgetSchema> | undefined {
  if (!b) return undefined;
  if (b.period_days !== undefined)
    return { amount: b.amount, period: BudgetPeriod.DAYS, periodDays: b.period_days };
  const period = { month: BudgetPeriod.MONTH, week: BudgetPeriod.WEEK, day: BudgetPeriod.DAY }[
    b.period ?? "month"
  ];
  return { amount: b.amount, period };
}

export const createAccountBody = z.strictObject({
  id: z.string().min(1),
  limits: rateLimitsBody.optional(),
});

const connectionLimitsBody = z.strictObject({
  requests_per_minute: perMinute.optional(),
  tokens_per_minute: perMinute.optional(),
  key_requests_per_minute: perMinute.optional(),
  key_tokens_per_minute: perMinute.optional(),
  routes: z.partialRecord(z.enum(ROUTE_NAMES), rateLimitsBody).optional(),
});

export const createConnectionBody = z.strictObject({
  id: z.string().min(1),
  models: z.array(z.string().min(1)).min(1),
  default_model: z.string().min(1).optional(),
  default_max_output_tokens: outputCap.optional(),
  max_output_tokens: outputCap.optional(),
  routes: z.array(z.enum(ROUTE_NAMES)).optional(),
  budget: budgetBody.optional(),
  limits: connectionLimitsBody.optional(),
});

export const updateAccountBody = z.strictObject({ limits: rateLimitsBody });

/** A budget object sets it; null clears it; absent keeps it. */
export const updateConnectionBody = z.strictObject({
  budget: budgetBody.nullable().optional(),
  limits: connectionLimitsBody.optional(),
});

export const updateKeyBody = z.strictObject({ budget: budgetBody.nullable() });

export const createKeyBody = z.strictObject({
  name: z.string().max(128).optional(),
  budget: budgetBody.optional(),
  expires_at: isoTime.optional(),
});

export const rotateKeyBody = z.strictObject({
  grace_seconds: z.number().int().min(0).max(MAX_GRACE_SECONDS).optional(),
  expires_at: isoTime.optional(),
});

export const usageQuery = z.strictObject({
  account: z.string().optional(),
  connection: z.string().optional(),
  key: z.string().optional(),
  model: z.string().optional(),
  from: isoTime.optional(),
  to: isoTime.optional(),
  granularity: z.enum(["hour", "day"]).optional(),
  /** `model`: one bucket per model and period. */
  group_by: z.enum(["model"]).optional(),
});

export const listKeysQuery = z.strictObject({ connection: z.string().optional() });

/** Parses with a schema; a failure is a 400 naming every problem. An absent body is `{}`. */
function parse<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  const result = schema.safeParse(value ?? {});
  if (!result.success) {
    throw new AdminError(
      "invalid_request",
      `invalid ${what}: ${describeIssues(result.error.issues).join("; ")}`,
    );
  }
  return result.data;
}

function limitsIn(l: z.output<typeof rateLimitsBody> | undefined): MessageInitShape<typeof RateLimitsSchema> {
  return {
    ...(l?.requests_per_minute !== undefined ? { requestsPerMinute: l.requests_per_minute } : {}),
    ...(l?.tokens_per_minute !== undefined ? { tokensPerMinute: l.tokens_per_minute } : {}),
  };
}
/** POST /admin/v1/accounts */
export function createAccountRequest(body: unknown): MessageInitShape<typeof CreateAccountRequestSchema> {
  const b = parse(createAccountBody, body, "account");
  return { accountId: b.id, limits: limitsIn(b.limits) };
}

/** POST /admin/v1/accounts/:accountId/connections */
export function createConnectionRequest(
  accountId: string,
  body: unknown,
): MessageInitShape<typeof CreateConnectionRequestSchema> {
  const b = parse(createConnectionBody, body, "connection");
  const l = b.limits;
  return {
    accountId,
    connectionId: b.id,
    models: b.models,
    defaultModel: b.default_model ?? "",
    ...(b.default_max_output_tokens !== undefined
      ? { defaultMaxOutputTokens: b.default_max_output_tokens }
      : {}),
    ...(b.max_output_tokens !== undefined ? { maxOutputTokens: b.max_output_tokens } : {}),
    routes: (b.routes ?? []).map((r) => ROUTE_BY_NAME[r]),
    ...(b.budget ? { budget: budgetIn(b.budget) } : {}),
    limits: connectionLimitsIn(l),
  };
}

function connectionLimitsIn(l: z.output<typeof connectionLimitsBody> | undefined) {
  return {
    connection: limitsIn({
      requests_per_minute: l?.requests_per_minute,
      tokens_per_minute: l?.tokens_per_minute,
    }),
    perKey: limitsIn({
      requests_per_minute: l?.key_requests_per_minute,
      tokens_per_minute: l?.key_tokens_per_minute,
    }),
    routes: Object.entries(l?.routes ?? {}).map(([route, limits]) => ({
      route: ROUTE_BY_NAME[route as RouteName],
      limits: limitsIn(limits),
    })),
  };
}

/** PATCH /admin/v1/accounts/:accountId: `{ limits }` replaces the account's limits. */
export function updateAccountRequest(
  accountId: string,
  body: unknown,
): MessageInitShape<typeof UpdateAccountRequestSchema> {
  const b = parse(updateAccountBody, body, "account update");
  return { accountId, limits: limitsIn(b.limits) };
}

/** PATCH /admin/v1/accounts/:accountId/connections/:connectionId: `{ budget?: {…} | null, limits? }`. */
export function updateConnectionRequest(
  accountId: string,
  connectionId: string,
  body: unknown,
): MessageInitShape<typeof UpdateConnectionRequestSchema> {
  const b = parse(updateConnectionBody, body, "connection update");
  return {
    accountId,
    connectionId,
    ...(b.budget ? { budget: budgetIn(b.budget) } : {}),
    clearBudget: b.budget === null,
    ...(b.limits ? { limits: connectionLimitsIn(b.limits) } : {}),
  };
}

/** PATCH /admin/v1/keys/:keyId: `{ budget: {…} | null }` sets or clears the key's own budget. */
export function updateKeyRequest(
  keyId: string,
  body: unknown,
): MessageInitShape<typeof UpdateKeyRequestSchema> {
  const b = parse(updateKeyBody, body, "key update");
  return { keyId, ...(b.budget ? { budget: budgetIn(b.budget) } : {}), clearBudget: b.budget === null };
}

/** POST /admin/v1/accounts/:accountId/connections/:connectionId/keys */
export function createKeyRequest(
  accountId: string,
  connectionId: string,
  body: unknown,
): MessageInitShape<typeof CreateKeyRequestSchema> {
  const b = parse(createKeyBody, body, "key");
  return {
    accountId,
    connectionId,
    name: b.name ?? "",
    ...(b.budget ? { budget: budgetIn(b.budget) } : {}),
    ...(b.expires_at ? { expiresAt: timestampFromDate(b.expires_at) } : {}),
  };
}

/** POST /admin/v1/keys/:keyId/rotate */
export function rotateKeyRequest(
  keyId: string,
  body: unknown,
): MessageInitShape<typeof RotateKeyRequestSchema> {
  const b = parse(rotateKeyBody, body, "rotation");
  return {
    keyId,
    ...(b.grace_seconds !== undefined ? { graceSeconds: b.grace_seconds } : {}),
    ...(b.expires_at ? { expiresAt: timestampFromDate(b.expires_at) } : {}),
  };
}

/** The `connection` filter of GET /admin/v1/accounts/:accountId/keys. */
export function listKeysFilter(query: unknown): string {
  return parse(listKeysQuery, query, "query").connection ?? "";
}

/** GET /admin/v1/usage?account=&connection=&key=&model=&from=&to=&granularity=&group_by=model */
export function usageRequest(query: unknown): MessageInitShape<typeof GetUsageRequestSchema> {
  const q = parse(usageQuery, query, "query");
  if (q.from && q.to && q.from.getTime() >= q.to.getTime()) {
    // The code metering answers for the same range (a `from` after now and no `to`, say).
    throw new AdminError("invalid_time_range", "from must be before to");
  }
  return {
    accountId: q.account ?? "",
    connectionId: q.connection ?? "",
    keyId: q.key ?? "",
    model: q.model ?? "",
    ...(q.from ? { from: timestampFromDate(q.from) } : {}),
    ...(q.to ? { to: timestampFromDate(q.to) } : {}),
    granularity: q.granularity ? GRANULARITY[q.granularity] : Granularity.UNSPECIFIED,
    ...(q.group_by === "model" ? { byModel: true } : {}),
  };
}

// ---------------------------------------------------------------------------------------------
// Responses

const iso = (t: Timestamp | undefined) => (t ? timestampDate(t).toISOString() : null);

function limitsOut(l: RateLimitsMsg | undefined) {
  return {
    requests_per_minute: l?.requestsPerMinute ?? null,
    tokens_per_minute: l?.tokensPerMinute ?? null,
  };
}

/**
 * A budget as the admin API shows it, in the shape a create request takes it: `{ amount, period }`
 * or `{ amount, period_days }`, the amount a decimal string of base units; null when none.
 */
function budgetOut(b: Budget | undefined) {
  if (!b) return null;
  if (b.period === BudgetPeriod.DAYS) return { amount: b.amount, period_days: b.periodDays };
  const period = b.period === BudgetPeriod.WEEK ? "week" : b.period === BudgetPeriod.DAY ? "day" : "month";
  return { amount: b.amount, period };
}

/**
 * A budget's current period (shown by the single-connection and single-key answers when a
 * budget applies): base units as decimal strings.
 */
function budgetUsageOut(u: BudgetUsage | undefined) {
  if (!u) return {};
  return {
    budget_usage: {
      spent: u.spent,
      held: u.held,
      remaining: u.remaining,
      period_start: iso(u.periodStart),
      period_end: iso(u.periodEnd),
    },
  };
}

/** An account as the admin API shows it. */
export function accountJson(a: Account | undefined) {
  return {
    id: a?.accountId ?? "",
    object: "account",
    limits: limitsOut(a?.limits),
    created_at: iso(a?.createdAt),
  };
}

/** A connection as the admin API shows it; `routes: null` means every route. */
export function connectionJson(c: Connection | undefined) {
  const routes: Partial<Record<RouteName, ReturnType<typeof limitsOut>>> = {};
  for (const r of c?.limits?.routes ?? []) {
    const name = operationOf(r.route);
    if (name) routes[name] = limitsOut(r.limits);
  }
  const names = (c?.routes ?? []).map((r) => operationOf(r)).filter((n) => n !== undefined);
  return {
    id: c?.connectionId ?? "",
    object: "connection",
    account_id: c?.accountId ?? "",
    models: [...(c?.models ?? [])],
    default_model: c?.defaultModel ?? "",
    default_max_output_tokens: c?.defaultMaxOutputTokens ?? 0,
    max_output_tokens: c?.maxOutputTokens ?? 0,
    routes: names.length > 0 ? names : null,
    limits: {
      ...limitsOut(c?.limits?.connection),
      key_requests_per_minute: c?.limits?.perKey?.requestsPerMinute ?? null,
      key_tokens_per_minute: c?.limits?.perKey?.tokensPerMinute ?? null,
      routes,
    },
    budget: budgetOut(c?.budget),
    ...budgetUsageOut(c?.budgetUsage),
    created_at: iso(c?.createdAt),
  };
}

/** A key as the admin API shows it: never its secret, never its hash. */
export function keyJson(k: KeyInfo | undefined) {
  return {
    id: k?.keyId ?? "",
    object: "key",
    account_id: k?.accountId ?? "",
    connection_id: k?.connectionId ?? "",
    name: k?.name ?? "",
    state: STATE_NAME[k?.state ?? KeyState.UNSPECIFIED] ?? "unknown",
    last4: k?.last4 ?? "",
    created_at: iso(k?.createdAt),
    expires_at: iso(k?.expiresAt),
    revoked_at: iso(k?.revokedAt),
    rotated_from: k?.rotatedFrom || null,
    rotated_to: k?.rotatedTo || null,
    grace_ends_at: iso(k?.graceEndsAt),
    budget: budgetOut(k?.budget),
    ...budgetUsageOut(k?.budgetUsage),
  };
}

function totalsJson(t: UsageTotals | undefined) {
  return {
    requests: Number(t?.requests ?? 0n),
    input_tokens: Number(t?.inputTokens ?? 0n),
    output_tokens: Number(t?.outputTokens ?? 0n),
    reasoning_tokens: Number(t?.reasoningTokens ?? 0n),
    // Money stays a decimal string of base units (6 decimals), never a float.
    cost: t?.cost || "0",
  };
}

/**
 * A usage report: totals over the range and one bucket per hour or day that saw usage (per model
 * and period, each bucket naming its model, when asked to group by model).
 */
export function usageJson(res: GetUsageResponse, granularity: Granularity, byModel = false) {
  return {
    object: "usage",
    granularity: granularity === Granularity.DAY ? "day" : "hour",
    ...(byModel ? { group_by: "model" } : {}),
    totals: totalsJson(res.totals),
    buckets: res.buckets.map((b) => ({
      start: iso(b.start),
      ...(byModel ? { model: b.model } : {}),
      ...totalsJson(b.totals),
    })),
  };
}
