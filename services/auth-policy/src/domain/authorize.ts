import { AuthError } from "./errors.js";
import { hashKey, sameHash } from "./keys.js";
import type { KeyStore } from "./ports.js";

/** What the caller asks for. */
export interface AuthorizeInput {
  key: string;
  /** Empty means the connection's default model. */
  model: string;
  /** Whether the route runs a model (false for GET /v1/models). */
  runsModel: boolean;
  maxOutputTokens?: number;
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
}

/** Longest key accepted before hashing; anything larger is not one of ours. */
const MAX_KEY_LENGTH = 256;

/**
 * Resolves a Virtual Key and applies its connection's policy (spec, "Authentication" and
 * "Errors": 401 for a missing, invalid, expired or revoked key; 403 outside policy).
 */
export async function authorize(
  store: KeyStore,
  input: AuthorizeInput,
  now = new Date(),
): Promise<Authorization> {
  if (input.key === "") throw new AuthError("missing_api_key", "no Virtual Key was sent");
  if (input.key.length > MAX_KEY_LENGTH)
    throw new AuthError("invalid_api_key", "the Virtual Key is not valid");
  const hash = hashKey(input.key);
  const record = await store.findByHash(hash);
  if (!record || !sameHash(record.hash, hash))
    throw new AuthError("invalid_api_key", "the Virtual Key is not valid");
  if (record.revoked) throw new AuthError("revoked_api_key", "the Virtual Key has been revoked");
  if (record.expiresAt && record.expiresAt.getTime() <= now.getTime()) {
    throw new AuthError("expired_api_key", "the Virtual Key has expired");
  }
  const policy = await store.connection(record.accountId, record.connectionId);
  if (!policy) throw new AuthError("invalid_api_key", "the Virtual Key is not valid");

  const base = {
    accountId: record.accountId,
    connectionId: record.connectionId,
    keyId: record.keyId,
    allowedModels: policy.models,
    defaultModel: policy.defaultModel,
  };
  if (!input.runsModel) return { ...base, model: "" };

  const model = input.model === "" ? policy.defaultModel : input.model;
  if (!policy.models.includes(model)) {
    throw new AuthError("model_not_allowed", `the model '${model}' is not available to this key`);
  }
  const cap = input.maxOutputTokens ?? policy.defaultMaxOutputTokens;
  if (cap > policy.maxOutputTokens) {
    throw new AuthError(
      "output_cap_above_policy",
      `the output cap ${cap} is above this connection's maximum of ${policy.maxOutputTokens}`,
    );
  }
  return { ...base, model, maxOutputTokens: cap };
}
