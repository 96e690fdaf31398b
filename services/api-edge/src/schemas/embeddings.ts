import { z } from "zod";

/**
 * Limits on POST /v1/embeddings (documented in docs/account-door.md, "Limits"): at most this many
 * inputs per request (OpenAI's own limit), each a non-empty string or a non-empty list of token
 * ids. The body's byte limit bounds the rest.
 */
export const EMBEDDINGS_LIMITS = {
  maxInputs: 2048,
  maxDimensions: 65_536,
  maxTokenId: 4_294_967_295,
} as const;

const text = z.string().min(1, { error: "an input must not be empty" });
const tokenId = z.number().int().min(0).max(EMBEDDINGS_LIMITS.maxTokenId);
const tokens = z.array(tokenId).min(1, { error: "a token list must not be empty" });
const INPUT_ERROR = `input must be a string, a list of at most ${EMBEDDINGS_LIMITS.maxInputs} strings, a list of token ids, or a list of at most ${EMBEDDINGS_LIMITS.maxInputs} such lists`;

/**
 * POST /v1/embeddings: OpenAI's embeddings request. `input` is a string, a list of strings, a list
 * of token ids or a list of such lists; `encoding_format` float (the default) or base64 (the
 * openai SDKs' default). Unknown fields are refused: everything an upstream is asked for is
 * bounded by the quote, which counts the input alone.
 */
export function embeddingsSchema(maxInputs: number = EMBEDDINGS_LIMITS.maxInputs) {
  return z.strictObject({
    model: z.string().min(1).max(256),
    input: z.union(
      [text, z.array(text).min(1).max(maxInputs), tokens, z.array(tokens).min(1).max(maxInputs)],
      { error: INPUT_ERROR },
    ),
    encoding_format: z.enum(["float", "base64"]).nullish(),
    dimensions: z.number().int().positive().max(EMBEDDINGS_LIMITS.maxDimensions).nullish(),
    user: z.string().max(256).nullish(),
  });
}

export type EmbeddingsRequest = z.output<ReturnType<typeof embeddingsSchema>>;

/**
 * The inputs a request embeds: one for a string or a single token list, else one per item. The
 * quote adds a per-input overhead for each (packages/config/src/pricing.ts, inputBoundOf).
 */
export function inputCountOf(req: Pick<EmbeddingsRequest, "input">): number {
  const input = req.input;
  if (typeof input === "string") return 1;
  return typeof input[0] === "number" ? 1 : input.length;
}
