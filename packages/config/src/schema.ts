import { z } from "zod";

/** The shape of every id: accounts, connections, keys, models, upstreams. */
export const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const id = z.string().regex(ID_PATTERN, "ids use letters, digits and . _ : -");
/** Base units are non-negative integers; YAML may give them as numbers or decimal strings. */
const baseUnits = z
  .union([z.number().int().nonnegative().max(Number.MAX_SAFE_INTEGER), z.string().regex(/^\d+$/)])
  .transform((v) => BigInt(v));

/** Largest budget amount: budget arithmetic in Redis Lua is exact below 2^53. */
export const MAX_BUDGET_AMOUNT = BigInt(Number.MAX_SAFE_INTEGER);

/** How spend is counted against a budget; periods are in UTC. */
const budgetPeriodSchema = z.union([
  /** Calendar month from the 1st (the default), ISO week from Monday, calendar day. */
  z.enum(["month", "week", "day"]),
  /** N days, counted from 1970-01-01 00:00 UTC onwards. */
  z.strictObject({ days: z.number().int().min(1).max(366) }),
]);

/** A spend cap per period in base units; a request whose quote does not fit is refused (402). */
export const budgetSchema = z.strictObject({
  amount: baseUnits.refine((v) => v <= MAX_BUDGET_AMOUNT, {
    message: `a budget is at most ${MAX_BUDGET_AMOUNT} base units`,
  }),
  period: budgetPeriodSchema.default("month"),
});

export const upstreamSchema = z.strictObject({
  id,
  /** Provider implementation; every OpenAI-compatible server shares one. */
  kind: z.enum(["openai-compatible"]).default("openai-compatible"),
  /** OpenAI-compatible base URL, ending in /v1 (vLLM, Ollama, llama.cpp server, OpenAI, ...). */
  baseUrl: z.url(),
  /** Name of the environment variable holding the upstream API key; never the key itself. */
  apiKeyEnv: z
    .string()
    .regex(/^[A-Z_][A-Z0-9_]*$/)
    .optional(),
  timeoutMs: z.number().int().positive().default(120_000),
});

export const modelSchema = z.strictObject({
  /** Public model id, as callers send it. */
  id,
  upstream: id,
  /** Model id the upstream expects. */
  upstreamModel: z.string().min(1),
  /** Runtime label (vllm, ollama, llama.cpp, openai, ...), recorded with usage. */
  runtime: z.string().min(1),
  pricing: z.strictObject({
    /** Base units of the payment token per million input tokens. */
    inputPerMillion: baseUnits,
    /** Base units of the payment token per million output tokens. */
    outputPerMillion: baseUnits,
  }),
  /** Largest output cap this model accepts. */
  maxOutputTokens: z.number().int().positive().default(4096),
  /** Whether the upstream returns reasoning content (used by /v1/think). */
  reasoning: z.boolean().default(false),
});

export const planNames = ["Starter", "Plus", "Premium"] as const;
export type PlanName = (typeof planNames)[number];

const planSchema = z.strictObject({ models: z.array(id).min(1), default: id });

const keySchema = z
  .strictObject({
    id,
    /** Development only: the key in clear text, hashed on load. */
    secret: z.string().min(16).optional(),
    /** SHA-256 of the key, hex; the production form. */
    sha256: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional(),
    expiresAt: z.iso.datetime({ offset: true }).optional(),
    revoked: z.boolean().default(false),
    /** The key's own spend cap, on top of its connection's; absent: none. */
    budget: budgetSchema.optional(),
  })
  .refine((k) => (k.secret === undefined) !== (k.sha256 === undefined), {
    message: "give exactly one of secret or sha256",
  });

/** The account-door routes, as named in configuration (policy and per-route limits). */
export const routeNames = ["models", "chat", "completions", "responses", "think"] as const;
export type RouteName = (typeof routeNames)[number];

const perMinute = z.number().int().positive().max(4_294_967_295).optional();

/** Per-minute caps of one scope; an absent field means unlimited. */
const rateLimitsSchema = z.strictObject({
  requestsPerMinute: perMinute,
  /** Counts each request's input estimate plus its effective output cap. */
  tokensPerMinute: perMinute,
});

const connectionLimitsSchema = z.strictObject({
  /** Every key of the connection together. */
  requestsPerMinute: perMinute,
  tokensPerMinute: perMinute,
  /** Each key of the connection on its own. */
  keyRequestsPerMinute: perMinute,
  keyTokensPerMinute: perMinute,
  /** Per route, every key of the connection together. */
  routes: z.partialRecord(z.enum(routeNames), rateLimitsSchema).optional(),
});

const connectionSchema = z.strictObject({
  id,
  models: z.array(id).min(1),
  defaultModel: id,
  /** Routes the connection's keys may call (403 route_not_allowed otherwise); absent: all. */
  routes: z.array(z.enum(routeNames)).min(1).optional(),
  /** Rate limits; absent: unlimited. */
  limits: connectionLimitsSchema.optional(),
  /** Spend cap of every key of the connection together; absent: none. */
  budget: budgetSchema.optional(),
  policy: z
    .strictObject({
      /** Output cap applied when a request carries none. */
      defaultMaxOutputTokens: z.number().int().positive().default(1024),
      /** Largest output cap a request may ask for (403 above it). */
      maxOutputTokens: z.number().int().positive().default(4096),
    })
    .prefault({}),
  keys: z.array(keySchema).default([]),
});

const accountSchema = z.strictObject({
  id,
  /** Rate limits over every connection and key of the account; absent: unlimited. */
  limits: rateLimitsSchema.optional(),
  connections: z.array(connectionSchema).min(1),
});

export const gatewayConfigSchema = z.strictObject({
  upstreams: z.array(upstreamSchema).min(1),
  models: z.array(modelSchema).min(1),
  plans: z.strictObject({ Starter: planSchema, Plus: planSchema, Premium: planSchema }).optional(),
  accounts: z.array(accountSchema).default([]),
});

export type GatewayConfig = z.output<typeof gatewayConfigSchema>;
export type UpstreamConfig = GatewayConfig["upstreams"][number];
export type ModelConfig = GatewayConfig["models"][number];
export type AccountConfig = GatewayConfig["accounts"][number];
export type ConnectionConfig = AccountConfig["connections"][number];
export type KeyConfig = ConnectionConfig["keys"][number];
export type PlanConfig = z.output<typeof planSchema>;
export type RateLimitsConfig = z.output<typeof rateLimitsSchema>;
export type ConnectionLimitsConfig = z.output<typeof connectionLimitsSchema>;
export type BudgetConfig = z.output<typeof budgetSchema>;
export type BudgetPeriodConfig = BudgetConfig["period"];

/**
 * Cross-reference problems zod cannot see: unknown ids, duplicates, defaults outside their lists.
 * Tolerant of a document that failed the schema, so both kinds are reported in one pass.
 */
export function crossCheck(doc: unknown): string[] {
  const cfg = (typeof doc === "object" && doc !== null ? doc : {}) as DeepPartial<GatewayConfig>;
  const list = <T>(v: T[] | undefined): T[] => (Array.isArray(v) ? v : []);
  const problems: string[] = [];
  const dupes = (label: string, ids: unknown[]) => {
    const seen = new Set<unknown>();
    for (const i of ids) {
      if (seen.has(i)) problems.push(`${label}: duplicate id "${String(i)}"`);
      seen.add(i);
    }
  };
  const upstreams = list(cfg.upstreams);
  const models = list(cfg.models);
  const accounts = list(cfg.accounts);
  const upstreamIds = new Set(upstreams.map((u) => u?.id));
  const modelIds = new Set(models.map((m) => m?.id));
  dupes(
    "upstreams",
    upstreams.map((u) => u?.id),
  );
  dupes(
    "models",
    models.map((m) => m?.id),
  );
  dupes(
    "accounts",
    accounts.map((a) => a?.id),
  );
  models.forEach((m, i) => {
    if (typeof m?.upstream === "string" && !upstreamIds.has(m.upstream)) {
      problems.push(`models.${i}.upstream: unknown upstream "${m.upstream}"`);
    }
  });
  for (const [name, plan] of Object.entries(cfg.plans ?? {})) {
    const planModels = list(plan?.models);
    planModels.forEach((m, i) => {
      if (!modelIds.has(m)) problems.push(`plans.${name}.models.${i}: unknown model "${m}"`);
    });
    if (plan?.default !== undefined && !planModels.includes(plan.default)) {
      problems.push(`plans.${name}.default: "${plan.default}" is not in its models`);
    }
  }
  const keyIds: unknown[] = [];
  accounts.forEach((a, ai) => {
    const connections = list(a?.connections);
    dupes(
      `accounts.${ai}.connections`,
      connections.map((c) => c?.id),
    );
    connections.forEach((c, ci) => {
      const at = `accounts.${ai}.connections.${ci}`;
      const connectionModels = list(c?.models);
      connectionModels.forEach((m, mi) => {
        if (!modelIds.has(m)) problems.push(`${at}.models.${mi}: unknown model "${m}"`);
      });
      if (c?.defaultModel !== undefined && !connectionModels.includes(c.defaultModel)) {
        problems.push(`${at}.defaultModel: "${c.defaultModel}" is not in its models`);
      }
      const policy = c?.policy;
      if (
        typeof policy?.defaultMaxOutputTokens === "number" &&
        typeof policy.maxOutputTokens === "number" &&
        policy.defaultMaxOutputTokens > policy.maxOutputTokens
      ) {
        problems.push(`${at}.policy.defaultMaxOutputTokens: above policy.maxOutputTokens`);
      }
      keyIds.push(...list(c?.keys).map((k) => k?.id));
    });
  });
  dupes("keys", keyIds);
  return problems;
}

type DeepPartial<T> = T extends readonly (infer U)[]
  ? DeepPartial<U>[]
  : T extends object
    ? { [K in keyof T]?: DeepPartial<T[K]> }
    : T;
