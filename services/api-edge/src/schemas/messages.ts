import { z } from "zod";
import { CHAT_LIMITS, closestOption } from "./chat.js";

/** A text content block; any other block type (image, document, tool_use, tool_result…) is refused. */
const textBlock = z.looseObject({
  type: z.literal("text", {
    error: "only text content blocks are accepted on this route (no images, documents or tools)",
  }),
  text: z.string(),
});

/** Content as Anthropic sends it: a string, or content blocks. */
const content = z.union([z.string(), z.array(textBlock).min(1)], {
  error: closestOption("content must be a string or a list of text blocks"),
});

/** Fields of the Messages API this route cannot honour, refused rather than ignored. */
const UNSUPPORTED: Record<string, string> = {
  tools: "tools are not supported on this route",
  tool_choice: "tools are not supported on this route",
  thinking: "extended thinking is not supported on this route (POST /v1/think reasons)",
};

/**
 * POST /v1/messages: the text subset of Anthropic's Messages API, buffered or streamed.
 * `max_tokens` is required (as Anthropic requires it) and is the output cap the request is
 * quoted and held for. Other fields (metadata, top_k, service_tier…) are ignored.
 */
export function messagesSchema(maxMessages: number = CHAT_LIMITS.maxMessages) {
  return z
    .looseObject({
      model: z.string().min(1).max(256).optional(),
      max_tokens: z
        .number({
          error: (iss) =>
            iss.input === undefined
              ? "max_tokens is required: the most tokens the answer may have"
              : "must be a number",
        })
        .int({ error: "must be a whole number" })
        .positive({ error: "must be at least 1" })
        .max(CHAT_LIMITS.maxOutputTokens, { error: `must be at most ${CHAT_LIMITS.maxOutputTokens}` }),
      messages: z
        .array(z.looseObject({ role: z.enum(["user", "assistant"]), content }))
        .min(1)
        .max(maxMessages),
      system: z.union([z.string(), z.array(textBlock)]).nullish(),
      temperature: z.number().min(0).max(1).nullish(),
      top_p: z.number().min(0).max(1).nullish(),
      stop_sequences: z.array(z.string().min(1)).max(16).nullish(),
      stream: z.boolean().nullish(),
    })
    .superRefine((r, ctx) => {
      for (const [field, message] of Object.entries(UNSUPPORTED)) {
        const value = (r as Record<string, unknown>)[field];
        const empty = value == null || (Array.isArray(value) && value.length === 0);
        const disabled = field === "thinking" && (value as { type?: unknown } | null)?.type === "disabled";
        if (!empty && !disabled) ctx.addIssue({ code: "custom", path: [field], message });
      }
    });
}

/** The Messages request with the default limits. */
export const messagesRequestSchema = messagesSchema();

export type MessagesRequest = z.output<typeof messagesRequestSchema>;
