import { createHash } from "node:crypto";
import type { ModelConfig } from "./schema.js";

const MILLION = 1_000_000n;

/** Token counts of one served request. */
export interface TokenUsage {
  inputTokens: number;
  outputTokens: number;
}

/** A model's prices in base units per million tokens. */
export interface Prices {
  inputPerMillion: bigint;
  outputPerMillion: bigint;
}

/** Rounds a non-negative rational up: spend is never under-counted by a fraction of a unit. */
function ceilDiv(n: bigint, d: bigint): bigint {
  return (n + d - 1n) / d;
}

/** Actual cost of a request in base units: integer arithmetic, rounded up once at the end. */
export function costOf(usage: TokenUsage, prices: Prices): bigint {
  const scaled =
    BigInt(usage.inputTokens) * prices.inputPerMillion + BigInt(usage.outputTokens) * prices.outputPerMillion;
  return ceilDiv(scaled, MILLION);
}

/**
 * A sound upper bound on a request's cost: every input token is at least one byte of the
 * request body (plus a fixed per-message overhead for chat templates), and the output is at
 * most the cap.
 */
export function quoteOf(bodyBytes: number, messageCount: number, outputCap: number, prices: Prices): bigint {
  const inputBound = bodyBytes + 8 * messageCount + 16;
  return costOf({ inputTokens: inputBound, outputTokens: outputCap }, prices);
}

/**
 * The pricing snapshot id: changes whenever any model's prices change, so every usage event
 * records the prices it was billed at.
 */
export function pricingSnapshotId(models: readonly Pick<ModelConfig, "id" | "pricing">[]): string {
  const canonical = [...models]
    .sort((a, b) => a.id.localeCompare(b.id))
    .map((m) => `${m.id}:${m.pricing.inputPerMillion}:${m.pricing.outputPerMillion}`)
    .join("\n");
  return `ps_${createHash("sha256").update(canonical).digest("hex").slice(0, 16)}`;
}
