import type { TokenUsage } from "./chat-answer.js";
import { type ResponseLabels, type ResponsesRequest, responseFromChat } from "./responses.js";
import {
  type NamedEvent,
  readChatDelta,
  type StreamFailure,
  type StreamTranslation,
} from "./stream-chunk.js";

/**
 * A streamed chat answer as the OpenAI Responses event sequence: `response.created`,
 * `response.in_progress`, the message item and its text part opened, one
 * `response.output_text.delta` per chunk that carries text, the text, part and item closed, and
 * `response.completed` (or `response.incomplete` when the output cap or a content filter cut the
 * answer) with the usage. A stream that fails after it started ends with `response.failed`.
 * Every event carries its `sequence_number`; one instance serves one stream.
 */
export class ResponsesStream implements StreamTranslation {
  #sequence = 0;
  #text = "";
  #finishReason: string | null = null;

  /** `done` gets the answer's whole text when the stream finishes (not when it fails). */
  constructor(
    private readonly req: ResponsesRequest,
    private readonly labels: ResponseLabels,
    private readonly done: (text: string) => unknown = () => {},
  ) {}

  #event(type: string, fields: Record<string, unknown>): NamedEvent {
    return { event: type, data: { type, sequence_number: this.#sequence++, ...fields } };
  }

  /** The response object as it stands: the translation of the answer so far. */
  #response(usage: TokenUsage) {
    return responseFromChat(
      this.req,
      { created: undefined, text: this.#text, reasoning: null, finishReason: this.#finishReason },
      usage,
      this.labels,
    );
  }

  #part() {
    return { type: "output_text", text: this.#text, annotations: [] };
  }

  #where() {
    return { item_id: this.labels.messageId, output_index: 0, content_index: 0 };
  }

  start(): NamedEvent[] {
    const response = {
      ...this.#response({ inputTokens: 0, outputTokens: 0, reasoningTokens: 0 }),
      status: "in_progress",
      incomplete_details: null,
      output: [],
      output_text: "",
      usage: null,
    };
    return [
      this.#event("response.created", { response }),
      this.#event("response.in_progress", { response }),
      this.#event("response.output_item.added", {
        output_index: 0,
        item: {
          type: "message",
          id: this.labels.messageId,
          status: "in_progress",
          role: "assistant",
          content: [],
        },
      }),
      this.#event("response.content_part.added", { ...this.#where(), part: this.#part() }),
    ];
  }

  /** The events of one upstream chat chunk (its parsed JSON). */
  chunk(json: unknown): NamedEvent[] {
    const delta = readChatDelta(json);
    if (delta.finishReason !== null) this.#finishReason = delta.finishReason;
    if (delta.text === "") return [];
    this.#text += delta.text;
    return [this.#event("response.output_text.delta", { ...this.#where(), delta: delta.text, logprobs: [] })];
  }

  /** The closing events of a finished stream; `extension` goes on the final event's top level. */
  finish(usage: TokenUsage, extension: Record<string, unknown> = {}): NamedEvent[] {
    const response = this.#response(usage);
    const final = response.status === "completed" ? "response.completed" : "response.incomplete";
    this.done(this.#text);
    return [
      this.#event("response.output_text.done", { ...this.#where(), text: this.#text, logprobs: [] }),
      this.#event("response.content_part.done", { ...this.#where(), part: this.#part() }),
      this.#event("response.output_item.done", { output_index: 0, item: response.output[0] }),
      this.#event(final, { response, ...extension }),
    ];
  }

  /** The closing event of a stream that failed after it started: the answer so far, failed. */
  fail(failure: StreamFailure, extension: Record<string, unknown> = {}): NamedEvent[] {
    const response = this.#response({ inputTokens: 0, outputTokens: 0, reasoningTokens: 0 });
    const item = response.output[0];
    return [
      this.#event("response.failed", {
        response: {
          ...response,
          status: "failed",
          incomplete_details: null,
          error: { code: failure.code, message: failure.message },
          output: item ? [{ ...item, status: "incomplete" }] : [],
          usage: null,
        },
        ...extension,
      }),
    ];
  }
}
