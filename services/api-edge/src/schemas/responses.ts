import { z } from "zod";
import { CHAT_LIMITS, closestOption } from "./chat.js";

/** Text content parts: `input_text`, and `output_text` for earlier assistant turns. */
const textPart = z.looseObject({
  type: z.enum(["input_text", "output_text"], {
    error: "only text content (input_text, output_text) is accepted on this route",
  }),
  text: z.string(),
});

/** One input message of the Responses API ("easy input message" or a `message` item). */
const inputMessage = z.looseObject({
  type: z
    .literal("message", { error: "only message and item_reference items are accepted in input" })
    .optional(),
  role: z.enum(["user", "assistant", "system", "developer"]),
  content: z.union([z.string(), z.array(textPart).min(1)], {
    error: closestOption("content must be a string or a list of input_text parts"),
  }),
});

/** An earlier answer's output item, by the id the gateway gave it (kept unless `store: false`). */
const itemReference = z.looseObject({
  type: z.literal("item_reference"),
  id: z.string().min(1).max(256),
});

/** One input item: a message, or a reference to a stored output item (judged by its `type`). */
const inputItem = z.union([itemReference, inputMessage], {
  error: (iss) => {
    const options = iss.code === "invalid_union" ? iss.errors : [];
    const isReference = (iss.input as { type?: unknown } | undefined)?.type === "item_reference";
    return options[isReference ? 0 : 1]?.[0]?.message ?? "input items must be messages or item references";
  },
});

export type ResponsesInputMessage = z.output<typeof inputMessage>;
export type ResponsesInputItem = z.output<typeof inputItem>;

/** OpenAI's limits on `metadata`, and how a request outside them is told. */
export const METADATA_LIMITS = { maxKeys: 16, maxKeyLength: 64, maxValueLength: 512 } as const;
const METADATA_RULE = `metadata must be an object of at most ${METADATA_LIMITS.maxKeys} keys of at most ${METADATA_LIMITS.maxKeyLength} characters, each with a string value of at most ${METADATA_LIMITS.maxValueLength} characters`;

/** Labels the caller attaches to a request, echoed in its response object. */
const metadata = z
  .record(
    z.string().max(METADATA_LIMITS.maxKeyLength),
    z.string({ error: METADATA_RULE }).max(METADATA_LIMITS.maxValueLength, { error: METADATA_RULE }),
    { error: METADATA_RULE },
  )
  .refine((m) => Object.keys(m).length <= METADATA_LIMITS.maxKeys, { error: METADATA_RULE });

/**
 * `text.format`: plain text (the default), any JSON object, or JSON that fits a schema. The
 * route asks the upstream for it as a chat `response_format` (domain/responses.ts).
 */
const textFormat = z.discriminatedUnion(
  "type",
  [
    z.object({ type: z.literal("text") }),
    z.object({ type: z.literal("json_object") }),
    z.object({
      type: z.literal("json_schema"),
      name: z
        .string()
        .regex(/^[a-zA-Z0-9_-]{1,64}$/, { error: "name must be 1 to 64 letters, digits, _ or -" }),
      schema: z.record(z.string(), z.unknown(), { error: "schema must be a JSON Schema object" }),
      strict: z.boolean().nullish(),
      description: z.string().optional(),
    }),
  ],
  {
    error:
      'format must be {type: "text"}, {type: "json_object"} or {type: "json_schema", name, schema, strict?, description?}',
  },
);

/**
 * POST /v1/responses: the text subset of OpenAI's Responses API, buffered or streamed. The route keeps
 * the output message of each answer (unless `store: false`) for `item_reference` inputs, no whole
 * response, so `previous_response_id` and tools are refused, and so are `conversation` and
 * `prompt`, which name state kept by OpenAI (a conversation's items, a stored prompt): answering
 * without it would silently drop context the caller meant to send. `text.format` asks for JSON
 * output and `metadata` is echoed in the answer; other fields are ignored.
 */
export function responsesSchema(maxMessages: number = CHAT_LIMITS.maxMessages) {
  return z
    .looseObject({
      model: z.string().min(1).max(256).optional(),
      input: z.union([z.string().min(1), z.array(inputItem).min(1).max(maxMessages)], {
        error: closestOption("input must be a string or a list of messages {role, content}"),
      }),
      instructions: z.string().nullish(),
      max_output_tokens: z.number().int().positive().max(CHAT_LIMITS.maxOutputTokens).nullish(),
      temperature: z.number().min(0).max(2).nullish(),
      top_p: z.number().min(0).max(1).nullish(),
      stream: z.boolean().nullish(),
      /** Keep the answer's output message for later `item_reference` inputs; default true. */
      store: z.boolean().nullish(),
      previous_response_id: z.string().nullish(),
      conversation: z.union([z.string(), z.looseObject({})]).nullish(),
      prompt: z.looseObject({}).nullish(),
      tools: z.array(z.unknown()).nullish(),
      /** The output's format; `verbosity` is accepted and ignored. */
      text: z
        .looseObject({
          format: textFormat.nullish(),
          verbosity: z.enum(["low", "medium", "high"]).nullish(),
        })
        .nullish(),
      metadata: metadata.nullish(),
    })
    .superRefine((r, ctx) => {
      if (r.previous_response_id != null) {
        ctx.addIssue({
          code: "custom",
          path: ["previous_response_id"],
          message: "responses are not stored (only their output messages): send the conversation as input",
        });
      }
      if (r.conversation != null) {
        ctx.addIssue({
          code: "custom",
          path: ["conversation"],
          message: "conversations are not stored: send the conversation as input",
        });
      }
      if (r.prompt != null) {
        ctx.addIssue({
          code: "custom",
          path: ["prompt"],
          message: "stored prompts are not offered: send the instructions and input",
        });
      }
      if (r.tools != null && r.tools.length > 0) {
        ctx.addIssue({ code: "custom", path: ["tools"], message: "tools are not supported on this route" });
      }
    });
}

/** The Responses request with the default limits. */
export const responsesRequestSchema = responsesSchema();

export type ResponsesRequest = z.output<typeof responsesRequestSchema>;

/** Usage of a Responses answer, in OpenAI's shape. */
export const responseUsageSchema = z.object({
  input_tokens: z.number().int(),
  input_tokens_details: z.object({ cached_tokens: z.number().int() }),
  output_tokens: z.number().int(),
  output_tokens_details: z.object({ reasoning_tokens: z.number().int() }),
  total_tokens: z.number().int(),
});

const outputMessage = z.object({
  type: z.literal("message"),
  id: z.string(),
  status: z.enum(["completed", "incomplete"]),
  role: z.literal("assistant"),
  content: z.array(
    z.object({ type: z.literal("output_text"), text: z.string(), annotations: z.array(z.never()) }),
  ),
});

/** The `response` object POST /v1/responses answers with (documented in docs/account-door.md, "Routes"). */
export const responseObjectSchema = z.object({
  id: z.string().startsWith("resp_"),
  object: z.literal("response"),
  created_at: z.number().int(),
  status: z.enum(["completed", "incomplete"]),
  /** Set when status is "incomplete": why the answer stopped early. */
  incomplete_details: z.object({ reason: z.enum(["max_output_tokens", "content_filter"]) }).nullable(),
  error: z.null(),
  model: z.string(),
  instructions: z.string().nullable(),
  max_output_tokens: z.number().int().nullable(),
  temperature: z.number().nullable(),
  top_p: z.number().nullable(),
  /** The request's `metadata`, {} when it had none. */
  metadata: z.record(z.string(), z.string()),
  parallel_tool_calls: z.boolean(),
  tool_choice: z.literal("none"),
  tools: z.array(z.never()),
  /** The request's `text.format` (fields it did not send left out), `{ type: "text" }` by default. */
  text: z.object({ format: textFormat }),
  output: z.array(outputMessage),
  /** All output text, concatenated (the SDKs compute the same from output). */
  output_text: z.string(),
  usage: responseUsageSchema,
});

export type ResponseObject = z.output<typeof responseObjectSchema>;
