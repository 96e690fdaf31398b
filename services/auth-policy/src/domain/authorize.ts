import { AuthError } from "./errors.js";
import { hashKey, keyState, sameHash, validUntil } from "./keys.js";
import type { KeyStore, RateLimiter, RouteName } from "./ports.js";
import { assertFitsAtAll, type RateLimitStatus, settle, windowsFor } from "./rate-limit.js";

/** What the caller asks for. */
export interface AuthorizeInput {
  key: string;
  /** The route called; undefined when the caller did not say (then only an unrestricted connection admits it). */
  route?: RouteName;
  /** Empty means the connection's default model. */
  model: string;
  maxOutputTokens?: number;
  /** Estimated input tokens, counted with the output cap against tokens-per-minute limits. */
  estimatedInputTokens?: number;
}

/** What the caller may do. */
export interface Authorization {
  accountId: string;
  connectionId: string;
  keyId: string;
  model: string;
  maxOutputTokens?: number;
  allowedModels: readonly string[];
  defaultModel: string;
  /** The rate-limit window closest to exhaustion after this request; undefined without limits. */
  rateLimit?: RateLimitStatus;
  /** When the key stops working unless revoked: expiry or end of rotation grace. */
  keyValidUntil?: Date;
}

/** What authorize() reads and counts. */
export interface AuthorizeDeps {
  store: KeyStore;
  limiter: RateLimiter;
}

/** Longest key accepted before hashing; anything larger is not one of ours. */
const MAX_KEY_LENGTH = 256;

const INVALID = "the Virtual Key is not valid";

const KEY_ENDED = {
  revoked: ["revoked_api_key", "the Virtual Key has been revoked"],
  expired: ["expired_api_key", "the Virtual Key has expired"],
  rotated: [
    "rotated_api_key",
    "the Virtual Key was rotated and its grace period has ended; use its replacement",
  ],
} as const;

/**
 * Resolves a Virtual Key and applies its connection's policy, in the order the spec's error
 * table implies (spec, "Authentication" and "Errors"): 401 for a missing, invalid, expired,
 * revoked or rotated-out key; 403 for a route, model or output cap outside policy; 429 when a
 * rate limit is reached. Everything is decided before any model runs, and a request refused
 * for any reason consumes no rate-limit units.
 */
export async function authorize(
  deps: AuthorizeDeps,
  input: AuthorizeInput,
  now = new Date(),
): Promise<Authorization> {
  if (input.key === "") throw new AuthError("missing_api_key", "no Virtual Key was sent");
  if (input.key.length > MAX_KEY_LENGTH) throw new AuthError("invalid_api_key", INVALID);
  const hash = hashKey(input.key);
  const record = await deps.store.findByHash(hash);
  if (!record || !sameHash(record.hash, hash)) throw new AuthError("invalid_api_key", INVALID);
  const state = keyState(record, now);
  if (state === "revoked" || state === "expired" || state === "rotated") {
    const [code, message] = KEY_ENDED[state];
    throw new AuthError(code, message);
  }
  const found = await deps.store.policy(record.accountId, record.connectionId);
  if (!found) throw new AuthError("invalid_api_key", INVALID);
  const { connection: policy, account } = found;

  if (policy.routes && !(input.route && policy.routes.includes(input.route))) {
    throw new AuthError(
      "route_not_allowed",
      input.route
        ? `the route '${input.route}' is not available to this key`
        : "the route is not available to this key",
    );
  }

  const until = validUntil(record);
  const base = {
    accountId: record.accountId,
    connectionId: record.connectionId,
    keyId: record.keyId,
    allowedModels: policy.models,
    defaultModel: policy.defaultModel,
    ...(until ? { keyValidUntil: until } : {}),
  };
  let model = "";
  let cap: number | undefined;
  if (input.route !== "models") {
    model = input.model === "" ? policy.defaultModel : input.model;
    if (!policy.models.includes(model)) {
      throw new AuthError("model_not_allowed", `the model '${model}' is not available to this key`);
    }
    cap = input.maxOutputTokens ?? policy.defaultMaxOutputTokens;
    if (cap > policy.maxOutputTokens) {
      throw new AuthError(
        "output_cap_above_policy",
        `the output cap ${cap} is above this connection's maximum of ${policy.maxOutputTokens}`,
      );
    }
  }

  const tokens = cap === undefined ? 0 : cap + (input.estimatedInputTokens ?? 0);
  const windows = windowsFor({
    connection: policy,
    keyId: record.keyId,
    tokens,
    ...(account ? { account } : {}),
    ...(input.route ? { route: input.route } : {}),
  });
  let rateLimit: RateLimitStatus | undefined;
  if (windows.length > 0) {
    assertFitsAtAll(windows);
    rateLimit = settle(windows, await deps.limiter.consume(windows, now));
  }
  return {
    ...base,
    model,
    ...(cap !== undefined ? { maxOutputTokens: cap } : {}),
    ...(rateLimit ? { rateLimit } : {}),
  };
}
