import type { TokenUsage } from "./chat-answer.js";

/** What a translated stream reads from one upstream chat chunk. */
export interface ChatDelta {
  /** New answer text; "" when the chunk carries none (a role-only or reasoning chunk). */
  text: string;
  /** The choice's finish reason, on the chunk that ends it. */
  finishReason: string | null;
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** Reads the first choice's delta of an OpenAI chat completion chunk. */
export function readChatDelta(json: unknown): ChatDelta {
  const body = isObject(json) ? json : {};
  const choice = Array.isArray(body.choices) && isObject(body.choices[0]) ? body.choices[0] : {};
  const delta = isObject(choice.delta) ? choice.delta : {};
  return {
    text: typeof delta.content === "string" ? delta.content : "",
    finishReason: typeof choice.finish_reason === "string" ? choice.finish_reason : null,
  };
}

/** One event of a translated stream: its SSE event name and its JSON payload. */
export interface NamedEvent {
  event: string;
  data: Json;
}

/** A stream failure as a translated stream reports it: the gateway's HTTP status, error code and message. */
export interface StreamFailure {
  status: number;
  code: string;
  message: string;
}

/** A stream translated from the upstream's chat chunks to another wire format; one instance serves one stream. */
export interface StreamTranslation {
  /** The events that open the stream. */
  start(): NamedEvent[];
  /** The events of one upstream chat chunk (its parsed JSON). */
  chunk(json: unknown): NamedEvent[];
  /** The closing events of a finished stream; `extension` goes on the event that carries the usage. */
  finish(usage: TokenUsage, extension: Record<string, unknown>): NamedEvent[];
  /**
   * The closing events of a stream that failed after it started; `extension` goes on the final
   * event (the money of what was produced, when that is billed).
   */
  fail(failure: StreamFailure, extension: Record<string, unknown>): NamedEvent[];
}
