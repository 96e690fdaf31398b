import { z } from "zod";
import { CHAT_LIMITS, fanOutFields, outputCapFields, refineFanOut } from "./chat.js";

/** Limits on a legacy text-completion request (documented in docs/account-door.md, "Routes"). */
export const COMPLETION_LIMITS = { maxPrompts: CHAT_LIMITS.maxMessages, maxStops: 4 } as const;

/**
 * POST /v1/completions: OpenAI's legacy text-completion request. Prompts are text (a string or
 * a list of strings; token-id prompts are not accepted). `n`, `best_of` and a prompt list are
 * priced into the quote (docs/money.md, "Fan-out"); fields beyond these (`echo`, `suffix`,
 * `logprobs`, ...) pass through to the upstream untouched, as on the chat route.
 */
export function completionSchema(maxPrompts: number = COMPLETION_LIMITS.maxPrompts) {
  return z
    .looseObject({
      model: z.string().min(1).max(256).optional(),
      prompt: z.union([z.string(), z.array(z.string()).min(1).max(maxPrompts)], {
        error: `prompt must be a string or a list of 1 to ${maxPrompts} strings`,
      }),
      ...outputCapFields,
      ...fanOutFields,
      temperature: z.number().min(0).max(2).nullish(),
      stop: z.union([z.string(), z.array(z.string()).max(COMPLETION_LIMITS.maxStops)]).nullish(),
      stream: z.boolean().nullish(),
      stream_options: z.looseObject({ include_usage: z.boolean().optional() }).nullish(),
    })
    .superRefine((req, ctx) => refineFanOut(req, promptCountOf(req), ctx));
}

/** Prompts of a completion request: one per list entry, or one. */
export function promptCountOf(req: { prompt: string | readonly string[] }): number {
  return Array.isArray(req.prompt) ? req.prompt.length : 1;
}

/** The text-completion request with the default limits. */
export const completionRequestSchema = completionSchema();

export type CompletionRequest = z.output<typeof completionRequestSchema>;
