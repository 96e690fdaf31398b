import { z } from "zod";
import { CHAT_LIMITS, chatSchema, outputCapOf } from "./chat.js";

/** How hard the model should think; forwarded to the upstream as `reasoning_effort`. */
export const REASONING_EFFORTS = ["low", "medium", "high"] as const;

const outputCap = z.number().int().positive().max(CHAT_LIMITS.maxOutputTokens);

/**
 * POST /v1/think: Tollgate's reasoning route (docs/account-door.md, "Routes"). Give `messages` (chat
 * messages) or `prompt` (one user message), not both. The output cap is `max_output_tokens`
 * (or `max_tokens`) and counts reasoning and answer tokens together. Buffered only. Unknown
 * fields are refused, so a misspelt field is never silently ignored.
 */
export function thinkSchema(maxMessages: number = CHAT_LIMITS.maxMessages) {
  return z
    .strictObject({
      model: z.string().min(1).max(256).optional(),
      messages: chatSchema(maxMessages).shape.messages.nullish(),
      prompt: z.string().min(1).nullish(),
      reasoning_effort: z.enum(REASONING_EFFORTS).nullish(),
      max_output_tokens: outputCap.nullish(),
      max_tokens: outputCap.nullish(),
      temperature: z.number().min(0).max(2).nullish(),
      stream: z.literal(false, { error: "this route is buffered: omit stream or send false" }).nullish(),
    })
    .superRefine((r, ctx) => {
      const given = (r.messages != null ? 1 : 0) + (r.prompt != null ? 1 : 0);
      if (given !== 1) {
        ctx.addIssue({
          code: "custom",
          path: [given === 0 ? "messages" : "prompt"],
          message: given === 0 ? "give messages or prompt" : "give messages or prompt, not both",
        });
      }
    });
}

/** The think request with the default limits. */
export const thinkRequestSchema = thinkSchema();

export type ThinkRequest = z.output<typeof thinkRequestSchema>;

/** The request's output cap: the smaller of max_output_tokens and max_tokens (see outputCapOf). */
export function thinkOutputCapOf(req: ThinkRequest): number | undefined {
  return outputCapOf(req);
}

/** The answer of POST /v1/think (documented in docs/account-door.md). */
export const thinkResponseSchema = z.object({
  id: z.string().startsWith("think_"),
  object: z.literal("think"),
  /** Unix seconds. */
  created: z.number().int(),
  /** The public model id that served the request. */
  model: z.string(),
  /** The final answer, without the reasoning. */
  answer: z.string(),
  /** The model's reasoning text; null when the upstream returned none. */
  reasoning: z.string().nullable(),
  /** "stop", or "length" when the output cap cut the reasoning or the answer short. */
  finish_reason: z.string().nullable(),
  usage: z.object({
    input_tokens: z.number().int(),
    /** Every generated token, reasoning included (as OpenAI counts completion tokens). */
    output_tokens: z.number().int(),
    /** The part of output_tokens spent reasoning. */
    reasoning_tokens: z.number().int(),
    total_tokens: z.number().int(),
  }),
});

export type ThinkResponse = z.output<typeof thinkResponseSchema>;
