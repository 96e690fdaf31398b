import { z } from "zod";

/**
 * Limits on an account-door chat request (documented in the README); the message count is a
 * default, configurable (MAX_MESSAGES).
 */
export const CHAT_LIMITS = { maxMessages: 2048, maxOutputTokens: 1_000_000 } as const;

const contentPart = z.looseObject({ type: z.string() });

/** One OpenAI chat message; fields beyond these pass through to the upstream untouched. */
const message = z.looseObject({
  role: z.enum(["system", "developer", "user", "assistant", "tool", "function"]),
  content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
});

const outputCap = z.number().int().positive().max(CHAT_LIMITS.maxOutputTokens);

/** POST /v1/chat/completions (spec, "Chat request"), with at most `maxMessages` messages. */
export function chatSchema(maxMessages: number = CHAT_LIMITS.maxMessages) {
  return z.looseObject({
    model: z.string().min(1).max(256).optional(),
    messages: z.array(message).min(1).max(maxMessages),
    max_tokens: outputCap.nullish(),
    max_completion_tokens: outputCap.nullish(),
    temperature: z.number().min(0).max(2).nullish(),
    stream: z.boolean().nullish(),
    stream_options: z.looseObject({ include_usage: z.boolean().optional() }).nullish(),
  });
}

/** The chat request with the default limits. */
export const chatRequestSchema = chatSchema();

export type ChatRequest = z.output<typeof chatRequestSchema>;

/** The request's output cap: max_completion_tokens wins over max_tokens, as OpenAI does. */
export function outputCapOf(req: {
  max_tokens?: number | null | undefined;
  max_completion_tokens?: number | null | undefined;
}) {
  return req.max_completion_tokens ?? req.max_tokens ?? undefined;
}

/** The paid door's plans (spec, "MPP-only request fields"). */
export const PLANS = ["Starter", "Plus", "Premium"] as const;

/**
 * POST /v1/mpp/chat/completions (spec, "Rules for POST /v1/mpp/chat/completions"): plan,
 * model_optimization and messages are required; model only when model_optimization is false;
 * an explicit output cap is required. `stream: true` is refused separately with its own code.
 */
export function paidChatSchema(maxMessages: number = CHAT_LIMITS.maxMessages) {
  return chatSchema(maxMessages)
    .extend({
      plan: z.enum(PLANS),
      model_optimization: z.boolean(),
    })
    .superRefine((req, ctx) => {
      if (req.model_optimization && req.model !== undefined) {
        ctx.addIssue({
          code: "custom",
          path: ["model"],
          message: "omit model when model_optimization is true",
        });
      }
      if (!req.model_optimization && req.model === undefined) {
        ctx.addIssue({
          code: "custom",
          path: ["model"],
          message: "model is required when model_optimization is false",
        });
      }
      if (outputCapOf(req) === undefined) {
        ctx.addIssue({
          code: "custom",
          path: ["max_tokens"],
          message: "an explicit output cap (max_tokens or max_completion_tokens) is required",
        });
      }
    });
}

/** The paid chat request with the default limits. */
export const paidChatRequestSchema = paidChatSchema();

export type PaidChatRequest = z.output<typeof paidChatRequestSchema>;
