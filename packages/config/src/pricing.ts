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
 * A bound on a request's input tokens: every input token is at least one byte of the request
 * body, plus a fixed overhead per message (8) and per request (16) for chat templates.
 */
export function inputBoundOf(bodyBytes: number, messageCount: number): number {
  return bodyBytes + 8 * messageCount + 16;
}

/** Every output-cap alias of the OpenAI wire formats; the upstream gets exactly one, the gateway's. */
export const OUTPUT_CAP_FIELDS = ["max_tokens", "max_completion_tokens", "max_output_tokens"] as const;
export type OutputCapField = (typeof OUTPUT_CAP_FIELDS)[number];

/**
 * The smallest output cap a body names in any alias (positive integers only), so no alias can ask
 * for more than the cap the quote and the policy saw; undefined when it names none.
 */
export function smallestOutputCap(body: Partial<Record<OutputCapField, unknown>>): number | undefined {
  const caps = OUTPUT_CAP_FIELDS.map((f) => body[f]).filter(
    (v): v is number => typeof v === "number" && Number.isInteger(v) && v > 0,
  );
  return caps.length > 0 ? Math.min(...caps) : undefined;
}

/**
 * Output-length fields that inference servers read besides OpenAI's: llama.cpp's `n_predict`
 * (read before `max_tokens`), TGI's and SGLang's `max_new_tokens`, Ollama's `num_predict`, and
 * the legacy `max_tokens_to_sample`; also inside the `options`, `parameters` and
 * `sampling_params` objects some of them take. None is ever forwarded: a positive integer in one
 * can only lower the one cap the upstream gets (docs/money.md, "The output cap").
 */
export const RUNTIME_CAP_FIELDS = [
  "n_predict",
  "max_new_tokens",
  "num_predict",
  "max_tokens_to_sample",
] as const;
const RUNTIME_CAP_CONTAINERS = ["options", "parameters", "sampling_params"] as const;

/**
 * Removes every output-length field from an upstream body (a copy the caller owns: nested
 * containers are copied before they change): OpenAI's cap aliases and the runtime fields above,
 * at the top level and, for the runtime fields, inside their containers. Returns the smallest
 * positive integer among them, the only way any of them counts; undefined when there was none.
 */
export function takeOutputCaps(body: Record<string, unknown>): number | undefined {
  let smallest: number | undefined;
  const take = (from: Record<string, unknown>, fields: readonly string[]) => {
    for (const f of fields) {
      if (!(f in from)) continue;
      const v = from[f];
      if (typeof v === "number" && Number.isInteger(v) && v > 0) smallest = Math.min(smallest ?? v, v);
      delete from[f];
    }
  };
  take(body, [...OUTPUT_CAP_FIELDS, ...RUNTIME_CAP_FIELDS]);
  for (const c of RUNTIME_CAP_CONTAINERS) {
    const inner = body[c];
    if (typeof inner !== "object" || inner === null || Array.isArray(inner)) continue;
    if (!RUNTIME_CAP_FIELDS.some((f) => f in inner)) continue;
    const copy = { ...(inner as Record<string, unknown>) };
    take(copy, RUNTIME_CAP_FIELDS);
    body[c] = copy;
  }
  return smallest;
}

/**
 * The paid door's own request fields (docs/contract.md, "The paid door"): they choose the plan
 * and the model at the gateway and mean nothing to an upstream, so they are never forwarded.
 */
export const PAID_DOOR_FIELDS = ["plan", "model_optimization"] as const;

/** Most output sequences one request may ask for (`n` × prompts, or `best_of` × prompts). */
export const MAX_OUTPUT_SEQUENCES = 4_096;

/**
 * A sound upper bound on a request's cost (docs/money.md, "The quote"): the input bound above,
 * and the output cap for each output sequence the upstream is asked for (choices `n` or
 * `best_of`, times prompts). This is the one quote rule; both doors price with it.
 */
export function quoteOf(
  bodyBytes: number,
  messageCount: number,
  outputCap: number,
  prices: Prices,
  outputSequences = 1,
): bigint {
  const sequences = Math.max(1, outputSequences);
  const inputTokens = inputBoundOf(bodyBytes, messageCount);
  const output = BigInt(outputCap) * BigInt(sequences) * prices.outputPerMillion;
  return ceilDiv(BigInt(inputTokens) * prices.inputPerMillion + output, MILLION);
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
