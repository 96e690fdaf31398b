import { OPERATION_NAMES, type OperationName } from "@tollgate/proto/routes";
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

/** Milliseconds: a positive integer, at most a day. */
const ms = z.number().int().positive().max(86_400_000);

/**
 * Per-attempt timeouts of an upstream call, one per phase: opening the connection, the first
 * byte of the answer (buffered) or its first chunk (streamed), the silence between two chunks
 * of an answer under way, and the whole attempt.
 */
const timeoutFields = {
  connectMs: ms,
  firstTokenMs: ms,
  idleMs: ms,
  totalMs: ms,
};
const timeoutsSchema = z.strictObject({
  connectMs: timeoutFields.connectMs.default(5_000),
  firstTokenMs: timeoutFields.firstTokenMs.default(60_000),
  idleMs: timeoutFields.idleMs.default(30_000),
  totalMs: timeoutFields.totalMs.default(120_000),
});

/**
 * When a failed upstream is cooled down (skipped by every router replica): `failures` failures
 * within `windowMs` cool it down for `durationMs` (after a failed probe of it, when a caller's
 * input could have caused them: docs/runbooks/inference-router.md); a 429 or 503 with
 * Retry-After cools it down for that long, at most `maxRetryAfterMs`.
 */
const cooldownFields = {
  failures: z.number().int().min(1).max(1_000),
  windowMs: ms,
  durationMs: ms,
  maxRetryAfterMs: ms,
};
const cooldownSchema = z.strictObject({
  failures: cooldownFields.failures.default(5),
  windowMs: cooldownFields.windowMs.default(10_000),
  durationMs: cooldownFields.durationMs.default(30_000),
  maxRetryAfterMs: cooldownFields.maxRetryAfterMs.default(60_000),
});

/**
 * Attempts per request (the first one included) and the full-jitter exponential backoff before
 * an upstream is tried again within one request.
 */
const retrySchema = z
  .strictObject({
    maxAttempts: z.number().int().min(1).max(10).default(3),
    baseBackoffMs: ms.default(100),
    maxBackoffMs: ms.default(2_000),
  })
  .refine((r) => r.baseBackoffMs <= r.maxBackoffMs, {
    message: "baseBackoffMs is above maxBackoffMs",
  });

/** Gateway-wide upstream resilience; each upstream may override `timeouts` and `cooldown`. */
const resilienceSchema = z.strictObject({
  timeouts: timeoutsSchema.prefault({}),
  retry: retrySchema.prefault({}),
  cooldown: cooldownSchema.prefault({}),
});

/** The wire protocols an upstream may speak, one provider each. */
export const upstreamKinds = ["openai-compatible", "anthropic"] as const;

export const upstreamSchema = z.strictObject({
  id,
  /**
   * The wire protocol the upstream speaks: `openai-compatible` (every OpenAI-compatible server
   * shares one provider) or `anthropic` (Anthropic's Messages API).
   */
  kind: z.enum(upstreamKinds).default("openai-compatible"),
  /**
   * openai-compatible: the base URL, ending in /v1 (vLLM, Ollama, llama.cpp server, OpenAI, ...);
   * anthropic: the API's base URL (https://api.anthropic.com), the calls go to {baseUrl}/v1/messages.
   */
  baseUrl: z.url(),
  /** Name of the environment variable holding the upstream API key; never the key itself. */
  apiKeyEnv: z
    .string()
    .regex(/^[A-Z_][A-Z0-9_]*$/)
    .optional(),
  /** Deprecated: the same as `timeouts.totalMs` (which wins when both are given). */
  timeoutMs: ms.optional(),
  /** Overrides of `resilience.timeouts` for this upstream. */
  timeouts: z.strictObject(timeoutFields).partial().optional(),
  /** Overrides of `resilience.cooldown` for this upstream. */
  cooldown: z.strictObject(cooldownFields).partial().optional(),
});

/** One upstream serving a model: lower `priority` first, `weight` among equal priorities. */
const modelUpstreamSchema = z.strictObject({
  id,
  /** Tried before every upstream with a higher number. */
  priority: z.number().int().min(0).max(1_000).default(0),
  /** Relative share of first attempts among the upstreams of the same priority. */
  weight: z.number().int().min(1).max(1_000).default(1),
  /** The model id this upstream expects, when it differs from the model's `upstreamModel`. */
  upstreamModel: z.string().min(1).optional(),
});

/** What a model does: chat-shaped completions, or embeddings of its input. */
export const modelKinds = ["chat", "embedding"] as const;
export type ModelKind = (typeof modelKinds)[number];

export const modelSchema = z
  .strictObject({
    /** Public model id, as callers send it. */
    id,
    /** The one upstream serving this model: shorthand for `upstreams: [{ id }]`. */
    upstream: id.optional(),
    /** Several upstreams serving this model, with failover between them. */
    upstreams: z.array(modelUpstreamSchema).min(1).optional(),
    /** Model id the upstream expects (each entry of `upstreams` may name its own). */
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
    /**
     * What the model does: `chat` (the chat, completions, responses, messages and think routes)
     * or `embedding` (POST /v1/embeddings only). A model is refused on the other kind's routes.
     */
    kind: z.enum(modelKinds).default("chat"),
    /**
     * An embedding model's vector length, as its upstream answers when the caller names no
     * `dimensions`. Informational: the gateway never sends it to the upstream.
     */
    dimensions: z.number().int().positive().max(65_536).optional(),
  })
  .refine((m) => (m.upstream === undefined) !== (m.upstreams === undefined), {
    message: "give exactly one of upstream or upstreams",
  })
  .refine((m) => m.kind !== "embedding" || m.pricing.outputPerMillion === 0n, {
    message: "an embedding model produces no output tokens: its pricing.outputPerMillion must be 0",
    path: ["pricing", "outputPerMillion"],
  })
  .refine((m) => m.kind !== "embedding" || !m.reasoning, {
    message: "an embedding model cannot reason",
    path: ["reasoning"],
  })
  .refine((m) => m.kind === "embedding" || m.dimensions === undefined, {
    message: "dimensions is for embedding models only",
    path: ["dimensions"],
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
export const routeNames = OPERATION_NAMES;
export type RouteName = OperationName;

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
  /**
   * The paid door's plans: any of the three, each optional. None (absent or empty) turns the
   * paid door off; a plan left out is refused by the paid door as not offered.
   */
  plans: z
    .strictObject({
      Starter: planSchema.optional(),
      Plus: planSchema.optional(),
      Premium: planSchema.optional(),
    })
    .optional()
    .transform((p) => (p && Object.values(p).some((v) => v !== undefined) ? p : undefined)),
  accounts: z.array(accountSchema).default([]),
  /** Timeouts, retries and cooldowns of upstream calls (defaults apply when absent). */
  resilience: resilienceSchema.prefault({}),
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
export type ModelUpstreamConfig = z.output<typeof modelUpstreamSchema>;
export type TimeoutsConfig = z.output<typeof timeoutsSchema>;
export type RetryConfig = z.output<typeof retrySchema>;
export type CooldownConfig = z.output<typeof cooldownSchema>;
export type ResilienceConfig = z.output<typeof resilienceSchema>;

/** The upstreams serving a model, whichever form the configuration used. */
export function modelUpstreams(m: Pick<ModelConfig, "upstream" | "upstreams">): ModelUpstreamConfig[] {
  return m.upstreams ?? (m.upstream !== undefined ? [{ id: m.upstream, priority: 0, weight: 1 }] : []);
}

/** An upstream's timeouts and cooldown: the gateway's, overridden by the upstream's own. */
export function upstreamPolicy(
  resilience: ResilienceConfig,
  u: UpstreamConfig,
): { timeouts: TimeoutsConfig; cooldown: CooldownConfig } {
  return {
    timeouts: {
      ...resilience.timeouts,
      ...(u.timeoutMs !== undefined ? { totalMs: u.timeoutMs } : {}),
      ...defined(u.timeouts),
    },
    cooldown: { ...resilience.cooldown, ...defined(u.cooldown) },
  };
}

function defined<T extends object>(o: T | undefined): Partial<T> {
  return Object.fromEntries(Object.entries(o ?? {}).filter(([, v]) => v !== undefined)) as Partial<T>;
}

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
  const embeddingIds = new Set(models.filter((m) => m?.kind === "embedding").map((m) => m?.id));
  const anthropicIds = new Set(upstreams.filter((u) => u?.kind === "anthropic").map((u) => u?.id));
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
    const served = list(m?.upstreams);
    served.forEach((u, j) => {
      if (typeof u?.id === "string" && !upstreamIds.has(u.id)) {
        problems.push(`models.${i}.upstreams.${j}.id: unknown upstream "${u.id}"`);
      }
    });
    dupes(
      `models.${i}.upstreams`,
      served.map((u) => u?.id),
    );
    // The Messages API has no embeddings.
    if (m?.kind === "embedding") {
      for (const u of [m.upstream, ...served.map((s) => s?.id)]) {
        if (anthropicIds.has(u))
          problems.push(`models.${i}: embedding model served by anthropic upstream "${u}"`);
      }
    }
  });
  for (const [name, plan] of Object.entries(cfg.plans ?? {})) {
    const planModels = list(plan?.models);
    planModels.forEach((m, i) => {
      if (!modelIds.has(m)) problems.push(`plans.${name}.models.${i}: unknown model "${m}"`);
      else if (embeddingIds.has(m)) {
        problems.push(`plans.${name}.models.${i}: "${m}" is an embedding model; the paid door serves chat`);
      }
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
