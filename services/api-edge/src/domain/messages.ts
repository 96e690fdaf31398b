import type { ChatAnswer, TokenUsage } from "./chat-answer.js";
import {
  type NamedEvent,
  readChatDelta,
  type StreamFailure,
  type StreamTranslation,
} from "./stream-chunk.js";

// The shapes below are what the translation reads and writes; schemas/messages.ts validates the
// wire format, and its parsed request fits MessagesRequest (checked by the type checker).

/** Text content as Anthropic sends it: a string, or text blocks. */
type Content = string | readonly { text: string }[];

/** The fields of a validated Messages request the translation reads. */
export interface MessagesRequest {
  max_tokens: number;
  messages: readonly { role: "user" | "assistant"; content: Content }[];
  system?: Content | null | undefined;
  temperature?: number | null | undefined;
  top_p?: number | null | undefined;
  stop_sequences?: readonly string[] | null | undefined;
}

/** Why an Anthropic answer stopped. */
export type StopReason = "end_turn" | "max_tokens" | "refusal";

/** The `message` object POST /v1/messages answers with. */
export interface AnthropicMessage {
  id: string;
  type: "message";
  role: "assistant";
  content: { type: "text"; text: string }[];
  model: string;
  stop_reason: StopReason | null;
  stop_sequence: null;
  usage: { input_tokens: number; output_tokens: number };
}

const textOf = (content: Content): string =>
  typeof content === "string" ? content : content.map((b) => b.text).join("");

/**
 * The chat request a Messages request stands for: `system` becomes the leading system message,
 * text blocks chat text parts, `max_tokens` the output cap (the smaller of it and the grant's),
 * `stop_sequences` the chat `stop`.
 */
export function chatBodyFromMessages(
  req: MessagesRequest,
  model: string,
  maxOutputTokens: number | undefined,
): Record<string, unknown> {
  const messages: { role: string; content: string | { type: "text"; text: string }[] }[] = [];
  if (req.system != null && textOf(req.system) !== "")
    messages.push({ role: "system", content: textOf(req.system) });
  for (const m of req.messages) {
    messages.push({
      role: m.role,
      content:
        typeof m.content === "string"
          ? m.content
          : m.content.map((b) => ({ type: "text" as const, text: b.text })),
    });
  }
  return {
    model,
    messages,
    max_tokens: Math.min(req.max_tokens, maxOutputTokens ?? req.max_tokens),
    ...(req.temperature != null ? { temperature: req.temperature } : {}),
    ...(req.top_p != null ? { top_p: req.top_p } : {}),
    ...(req.stop_sequences != null && req.stop_sequences.length > 0 ? { stop: req.stop_sequences } : {}),
  };
}

/**
 * An upstream finish reason as Anthropic's stop reason. A stop sequence shows as `end_turn`: a
 * chat upstream does not say whether one matched, or which.
 */
export function stopReasonOf(finishReason: string | null): StopReason | null {
  if (finishReason === null) return null;
  if (finishReason === "length") return "max_tokens";
  if (finishReason === "content_filter") return "refusal";
  return "end_turn";
}

/** What the answer is labelled with besides the upstream's content. */
export interface MessageLabels {
  /** "msg_…" */
  id: string;
  /** Public model id that served the request. */
  model: string;
}

/** A chat answer as an Anthropic `message`. */
export function messageFromChat(
  answer: ChatAnswer,
  usage: TokenUsage,
  labels: MessageLabels,
): AnthropicMessage {
  return {
    id: labels.id,
    type: "message",
    role: "assistant",
    content: [{ type: "text", text: answer.text }],
    model: labels.model,
    stop_reason: stopReasonOf(answer.finishReason),
    stop_sequence: null,
    usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
  };
}

/**
 * Anthropic's error `type` for an HTTP status, as its API answers it
 * (`{"type":"error","error":{"type":…,"message":…}}`).
 */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 400:
    case 405:
    case 409:
    case 415:
    case 422:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 402:
      return "billing_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 408:
    case 504:
      return "timeout_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
    default:
      return status < 500 ? "invalid_request_error" : "api_error";
  }
}

/**
 * A streamed chat answer as Anthropic's Messages event sequence: `message_start`, one text
 * `content_block_start`, one `content_block_delta` per chunk that carries text,
 * `content_block_stop`, `message_delta` with the stop reason and usage, `message_stop`. A
 * stream that fails after it started ends with an `error` event. One instance serves one stream.
 */
export class MessagesStream implements StreamTranslation {
  #finishReason: string | null = null;

  constructor(private readonly labels: MessageLabels) {}

  start(): NamedEvent[] {
    const message = {
      ...messageFromChat(
        { created: undefined, text: "", reasoning: null, finishReason: null },
        { inputTokens: 0, outputTokens: 0, reasoningTokens: 0 },
        this.labels,
      ),
      content: [],
    };
    return [
      { event: "message_start", data: { type: "message_start", message } },
      {
        event: "content_block_start",
        data: { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
      },
    ];
  }

  chunk(json: unknown): NamedEvent[] {
    const delta = readChatDelta(json);
    if (delta.finishReason !== null) this.#finishReason = delta.finishReason;
    if (delta.text === "") return [];
    return [
      {
        event: "content_block_delta",
        data: { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: delta.text } },
      },
    ];
  }

  /** The closing events; the input tokens, known only now, ride in `message_delta`'s usage. */
  finish(usage: TokenUsage, extension: Record<string, unknown> = {}): NamedEvent[] {
    return [
      { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
      {
        event: "message_delta",
        data: {
          type: "message_delta",
          delta: { stop_reason: stopReasonOf(this.#finishReason) ?? "end_turn", stop_sequence: null },
          usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
          ...extension,
        },
      },
      { event: "message_stop", data: { type: "message_stop" } },
    ];
  }

  fail(failure: StreamFailure, extension: Record<string, unknown> = {}): NamedEvent[] {
    return [
      {
        event: "error",
        data: {
          type: "error",
          error: { type: anthropicErrorType(failure.status), message: failure.message, code: failure.code },
          ...extension,
        },
      },
    ];
  }
}
