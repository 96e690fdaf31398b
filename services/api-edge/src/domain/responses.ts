import type { ChatAnswer, TokenUsage } from "./chat-answer.js";

// The shapes below are what the translation reads and writes. schemas/responses.ts validates
// the wire format; its parsed request fits ResponsesRequest and ResponseObject fits its response
// schema (both checked by the type checker: the route, and responses.test.ts).

/** One input message of a Responses request: a string, or text parts. */
export interface ResponsesInputMessage {
  role: "user" | "assistant" | "system" | "developer";
  content: string | readonly { text: string }[];
}

/** An input item naming an earlier answer's output message by its id. */
export interface ItemReference {
  type: "item_reference";
  id: string;
}

/** One input item as sent: a message, or a reference to a stored output message. */
export type ResponsesInputItem = (ResponsesInputMessage & { type?: "message" | undefined }) | ItemReference;

/** Where an input refers to stored output items: each reference's place in the list and its id. */
export function itemReferencesOf(
  input: string | readonly ResponsesInputItem[],
): { index: number; id: string }[] {
  if (typeof input === "string") return [];
  return input.flatMap((item, index) => (item.type === "item_reference" ? [{ index, id: item.id }] : []));
}

/**
 * The input with each item reference replaced by the assistant message it names: `texts[i]` is
 * the text of the i-th reference (itemReferencesOf's order).
 */
function withReferencedItems(
  input: string | readonly ResponsesInputItem[],
  texts: readonly string[],
): string | ResponsesInputMessage[] {
  if (typeof input === "string") return input;
  let next = 0;
  return input.map((item) =>
    item.type === "item_reference" ? { role: "assistant" as const, content: texts[next++] ?? "" } : item,
  );
}

/**
 * A `text.format`: the output as text (the default), any JSON object, or JSON fitting a schema;
 * `Strict` is what its `strict` may be.
 */
type TextFormat<Strict> =
  | { type: "text" }
  | { type: "json_object" }
  | {
      type: "json_schema";
      name: string;
      schema: Record<string, unknown>;
      strict?: Strict;
      description?: string;
    };

/** A request's `text.format` as sent (`strict` may be null). */
export type ResponsesTextFormat = TextFormat<boolean | null>;

/** `text.format` as the answer echoes it and the upstream is asked for it: absent fields left out. */
export type ResponseTextFormat = TextFormat<boolean>;

/** The fields of a validated Responses request the translation reads. */
export interface ResponsesRequest {
  input: string | readonly ResponsesInputItem[];
  instructions?: string | null | undefined;
  temperature?: number | null | undefined;
  top_p?: number | null | undefined;
  text?: { format?: ResponsesTextFormat | null | undefined } | null | undefined;
  metadata?: Record<string, string> | null | undefined;
}

/** The request's output format, normalised: `{ type: "text" }` when it named none. */
export function textFormatOf(req: ResponsesRequest): ResponseTextFormat {
  const format = req.text?.format ?? { type: "text" };
  if (format.type !== "json_schema") return { type: format.type };
  const { name, schema, strict, description } = format;
  return {
    type: "json_schema",
    name,
    schema,
    ...(strict != null ? { strict } : {}),
    ...(description !== undefined ? { description } : {}),
  };
}

/**
 * The chat `response_format` of a Responses output format: none for text (the upstream's
 * default), the JSON modes as the chat API names them.
 */
function responseFormatOf(format: ResponseTextFormat): Record<string, unknown> | undefined {
  if (format.type === "text") return undefined;
  if (format.type === "json_object") return { type: "json_object" };
  const { type, ...jsonSchema } = format;
  return { type, json_schema: jsonSchema };
}

/** Usage of a Responses answer, in OpenAI's shape. */
export interface ResponseUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

/** The one output item of an answer: the assistant's message. */
export interface ResponseOutputMessage {
  type: "message";
  id: string;
  status: "completed" | "incomplete";
  role: "assistant";
  content: { type: "output_text"; text: string; annotations: never[] }[];
}

/** The `response` object POST /v1/responses answers with. */
export interface ResponseObject {
  id: string;
  object: "response";
  created_at: number;
  status: "completed" | "incomplete";
  incomplete_details: { reason: "max_output_tokens" | "content_filter" } | null;
  error: null;
  model: string;
  instructions: string | null;
  max_output_tokens: number | null;
  temperature: number | null;
  top_p: number | null;
  metadata: Record<string, string>;
  parallel_tool_calls: boolean;
  tool_choice: "none";
  tools: never[];
  text: { format: ResponseTextFormat };
  output: ResponseOutputMessage[];
  output_text: string;
  usage: ResponseUsage;
}

type ChatMessage = {
  role: "system" | "user" | "assistant";
  content: string | { type: "text"; text: string }[];
};

function chatMessageOf(m: ResponsesInputMessage): ChatMessage {
  // "developer" is the Responses name for system instructions; many open-weight chat templates
  // know only "system".
  const role = m.role === "developer" ? "system" : m.role;
  const content =
    typeof m.content === "string"
      ? m.content
      : m.content.map((p) => ({ type: "text" as const, text: p.text }));
  return { role, content };
}

/**
 * The chat request a Responses request stands for: `instructions` become the leading system
 * message, a string `input` one user message, text parts chat text parts, each item reference
 * the assistant message of `referenced` (the texts of itemReferencesOf's items), and a JSON
 * `text.format` the chat `response_format`.
 */
export function chatBodyFromResponses(
  req: ResponsesRequest,
  model: string,
  maxOutputTokens: number | undefined,
  referenced: readonly string[] = [],
): Record<string, unknown> {
  const input = withReferencedItems(req.input, referenced);
  const messages: ChatMessage[] = [];
  if (req.instructions) messages.push({ role: "system", content: req.instructions });
  if (typeof input === "string") messages.push({ role: "user", content: input });
  else messages.push(...input.map(chatMessageOf));
  const responseFormat = responseFormatOf(textFormatOf(req));
  return {
    model,
    messages,
    ...(maxOutputTokens !== undefined ? { max_tokens: maxOutputTokens } : {}),
    ...(req.temperature != null ? { temperature: req.temperature } : {}),
    ...(req.top_p != null ? { top_p: req.top_p } : {}),
    ...(responseFormat ? { response_format: responseFormat } : {}),
  };
}

/** What the answer is labelled with besides the upstream's content. */
export interface ResponseLabels {
  /** "resp_…" */
  id: string;
  /** "msg_…" */
  messageId: string;
  /** Public model id that served the request. */
  model: string;
  /** The effective output cap. */
  maxOutputTokens: number | undefined;
  /** Unix seconds, used when the upstream did not say. */
  now: number;
}

/**
 * A chat answer as a Responses `response` object. An answer cut short by the output cap (or a
 * content filter) is `incomplete` with its reason, as OpenAI reports it; otherwise `completed`.
 */
export function responseFromChat(
  req: ResponsesRequest,
  answer: ChatAnswer,
  usage: TokenUsage,
  labels: ResponseLabels,
): ResponseObject {
  const reason =
    answer.finishReason === "length"
      ? "max_output_tokens"
      : answer.finishReason === "content_filter"
        ? "content_filter"
        : undefined;
  const status = reason ? "incomplete" : "completed";
  return {
    id: labels.id,
    object: "response",
    created_at: answer.created ?? labels.now,
    status,
    incomplete_details: reason ? { reason } : null,
    error: null,
    model: labels.model,
    instructions: req.instructions ?? null,
    max_output_tokens: labels.maxOutputTokens ?? null,
    temperature: req.temperature ?? null,
    top_p: req.top_p ?? null,
    metadata: req.metadata ?? {},
    parallel_tool_calls: false,
    tool_choice: "none",
    tools: [],
    text: { format: textFormatOf(req) },
    output: [
      {
        type: "message",
        id: labels.messageId,
        status,
        role: "assistant",
        content: [{ type: "output_text", text: answer.text, annotations: [] }],
      },
    ],
    output_text: answer.text,
    usage: {
      input_tokens: usage.inputTokens,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: usage.outputTokens,
      output_tokens_details: { reasoning_tokens: usage.reasoningTokens },
      total_tokens: usage.inputTokens + usage.outputTokens,
    },
  };
}
