import { MAX_OUTPUT_SEQUENCES, type OutputCapField, smallestOutputCap } from "@tollgate/config";
import { z } from "zod";

/**
 * Limits on an account-door chat request (documented in docs/account-door.md, "Limits"); the message count is a
 * default, configurable (MAX_MESSAGES).
 */
export const CHAT_LIMITS = { maxMessages: 2048, maxOutputTokens: 1_000_000 } as const;

/**
 * The message of a string-or-list union: the problem of the option the value looked like (a
 * list's own issue, with its place), not zod's bare "Invalid input".
 */
export function closestOption(fallback: string) {
  return (iss: z.core.$ZodRawIssue): string => {
    const options = iss.code === "invalid_union" ? iss.errors : [];
    const tried = options.find(
      (issues) => !(issues.length === 1 && issues[0]?.code === "invalid_type" && issues[0].path.length === 0),
    );
    const first = tried?.[0];
    if (!first) return fallback;
    // A union inside (an input item) said its chosen option's first message: add that one's place.
    const inner =
      first.code === "invalid_union"
        ? first.errors.find((o) => o[0]?.message === first.message)?.[0]
        : undefined;
    const path = [...first.path, ...(inner?.path ?? [])];
    return `${path.length > 0 ? `${path.join(".")}: ` : ""}${first.message}`;
  };
}

/**
 * Text content parts only (`text`, and `refusal` in an earlier assistant turn): each input token
 * of text is at least a byte of the body, which bounds the quote (docs/money.md, "The quote").
 * An image, audio or file part costs input tokens that no byte count bounds, so it is refused.
 */
const contentPart = z.looseObject({
  type: z.enum(["text", "refusal"], {
    error:
      "only text content parts are accepted (no image, audio or file): their input cannot be bounded by a quote",
  }),
});

/**
 * One OpenAI chat message; fields beyond these pass through to the upstream untouched. Every
 * message has its content (docs/account-door.md, "Limits"), except an earlier assistant turn,
 * whose content may be absent or null beside its tool calls, and a legacy function message.
 */
const message = z
  .looseObject({
    role: z.enum(["system", "developer", "user", "assistant", "tool", "function"]),
    content: z
      .union([z.string(), z.array(contentPart), z.null()], {
        error: closestOption("content must be a string, a list of text parts or null"),
      })
      .optional(),
  })
  .superRefine((m, ctx) => {
    if ((m.content === undefined || m.content === null) && m.role !== "assistant" && m.role !== "function") {
      ctx.addIssue({ code: "custom", path: ["content"], message: `a ${m.role} message needs its content` });
    }
  });

const outputCap = z.number().int().positive().max(CHAT_LIMITS.maxOutputTokens);

/**
 * The fields that make the upstream produce more than one output sequence (docs/money.md,
 * "Fan-out"): `n` choices, and `best_of` candidates (vLLM, legacy completions), each bounded by
 * the output cap and priced into the quote. Beam search, whose work no field bounds, is refused.
 */
export const FAN_OUT_LIMITS = { maxChoices: 128, maxBestOf: 20 } as const;

export const fanOutFields = {
  n: z.number().int().min(1).max(FAN_OUT_LIMITS.maxChoices).nullish(),
  best_of: z.number().int().min(1).max(FAN_OUT_LIMITS.maxBestOf).nullish(),
  use_beam_search: z
    .literal(false, { error: "beam search is not offered: its output cannot be bounded by a quote" })
    .nullish(),
};

const OWN_TEMPLATE =
  "a chat template of the request's own is not offered: the prompt it renders cannot be bounded by a quote";

/**
 * A chat template sent with the request (vLLM's `chat_template`, at the top level or inside
 * `chat_template_kwargs`): the prompt it renders may be any length whatever the body's size, so
 * no byte count bounds its input tokens (docs/money.md, "The quote"). Refused, as beam search
 * is; the template's arguments alone (`chat_template_kwargs`, such as `enable_thinking`) are
 * read by the upstream's own template and pass through.
 */
export const templateFields = {
  chat_template: z.null({ error: OWN_TEMPLATE }).optional(),
  chat_template_kwargs: z
    .looseObject({ chat_template: z.null({ error: OWN_TEMPLATE }).optional() })
    .nullish(),
};

/** Every output-cap alias a caller may send; the router forwards exactly one cap, the gateway's. */
export const outputCapFields = {
  max_tokens: outputCap.nullish(),
  max_completion_tokens: outputCap.nullish(),
  max_output_tokens: outputCap.nullish(),
} satisfies Record<OutputCapField, z.ZodType>;

/** Output sequences a request asks for: the larger of `n` and `best_of`, for each prompt. */
export function outputSequencesOf(
  req: { n?: number | null | undefined; best_of?: number | null | undefined },
  prompts = 1,
): number {
  return prompts * Math.max(req.n ?? 1, req.best_of ?? 1);
}

/** Refuses a request whose fan-out is larger than one quote may price. */
export function refineFanOut(
  req: { n?: number | null | undefined; best_of?: number | null | undefined },
  prompts: number,
  ctx: z.core.$RefinementCtx,
): void {
  if (outputSequencesOf(req, prompts) > MAX_OUTPUT_SEQUENCES) {
    ctx.addIssue({
      code: "custom",
      path: ["n"],
      message: `n (or best_of) times the number of prompts must be at most ${MAX_OUTPUT_SEQUENCES}`,
    });
  }
}

/** POST /v1/chat/completions (OpenAI's chat request), with at most `maxMessages` messages. */
export function chatSchema(maxMessages: number = CHAT_LIMITS.maxMessages) {
  return z.looseObject({
    model: z.string().min(1).max(256).optional(),
    messages: z.array(message).min(1).max(maxMessages),
    ...outputCapFields,
    ...fanOutFields,
    ...templateFields,
    temperature: z.number().min(0).max(2).nullish(),
    stream: z.boolean().nullish(),
    stream_options: z.looseObject({ include_usage: z.boolean().optional() }).nullish(),
  });
}

/** The chat request with the default limits. */
export const chatRequestSchema = chatSchema();

export type ChatRequest = z.output<typeof chatRequestSchema>;

/**
 * The request's output cap: the smallest of every cap field it carries (`max_tokens`,
 * `max_completion_tokens`, `max_output_tokens`), so no alias can ask the upstream for more
 * than the cap the quote and the policy saw; undefined when it carries none.
 */
export function outputCapOf(
  req: Partial<Record<OutputCapField, number | null | undefined>>,
): number | undefined {
  return smallestOutputCap(req);
}

/** The paid door's plans (docs/contract.md, "The paid door"). */
export const PLANS = ["Starter", "Plus", "Premium"] as const;

/**
 * POST /v1/mpp/chat/completions (docs/contract.md, "The paid door"): plan,
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
