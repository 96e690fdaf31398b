import type { ProviderChunk, ProviderRequest, ProviderResult, TokenCounts } from "../../domain/ports.js";
import type { DecodedEvent } from "../upstream-http/http-provider.js";
import { errorEventFailure, unreadable } from "./errors.js";

/**
 * Anthropic usage → token counts. Input is every input token the upstream read: the uncached
 * ones (`input_tokens`) plus those written to and read from its prompt cache (the gateway prices
 * every input token alike). Undefined when the upstream sent none, and when what it sent is not
 * a count (docs/spend.md, "Without a count from the upstream"): an `input_tokens` or
 * `output_tokens` missing or not a non-negative integer, or a cache count given but not one.
 * The domain then estimates, so an upstream that misreports cannot serve a request free.
 */
export function anthropicUsage(raw: unknown): TokenCounts | undefined {
  const inputTokens = inputOf(raw);
  if (inputTokens === undefined) return undefined;
  const outputTokens = tokenCount((raw as Record<string, unknown>).output_tokens);
  if (outputTokens === undefined) return undefined;
  return { inputTokens, outputTokens, reasoningTokens: 0 };
}

/** The input tokens of an Anthropic usage (cache writes and reads included); undefined: no count. */
function inputOf(raw: unknown): number | undefined {
  if (typeof raw !== "object" || raw === null) return undefined;
  const u = raw as Record<string, unknown>;
  const uncached = tokenCount(u.input_tokens);
  // The cache counts are absent (or null) when the prompt cache was not used.
  const cached = (v: unknown) => (v === undefined || v === null ? 0 : tokenCount(v));
  const written = cached(u.cache_creation_input_tokens);
  const read = cached(u.cache_read_input_tokens);
  if (uncached === undefined || written === undefined || read === undefined) return undefined;
  return uncached + written + read;
}

/** Anthropic's stop reason as an OpenAI finish reason. */
export function finishReason(stop: unknown): string {
  return stop === "max_tokens" ? "length" : stop === "refusal" ? "content_filter" : "stop";
}

/** A Messages API answer as the router's chat completion (or text completion) JSON, with its usage. */
export function completionOf(message: Record<string, unknown>, req: ProviderRequest): ProviderResult {
  if (message.type !== "message" || !Array.isArray(message.content)) throw unreadable();
  let text = "";
  let reasoning = "";
  for (const block of message.content as Array<Record<string, unknown>>) {
    if (block?.type === "text" && typeof block.text === "string") text += block.text;
    else if (block?.type === "thinking" && typeof block.thinking === "string") reasoning += block.thinking;
  }
  const usage = anthropicUsage(message.usage);
  const finish = finishReason(message.stop_reason);
  const chat = req.operation === "chat";
  const assistant: Record<string, unknown> = { role: "assistant", content: text };
  if (reasoning !== "") assistant.reasoning_content = reasoning;
  const json: Record<string, unknown> = {
    id: typeof message.id === "string" ? message.id : "",
    object: chat ? "chat.completion" : "text_completion",
    created: Math.floor(Date.now() / 1000),
    model: message.model ?? req.body.model,
    choices: [
      chat
        ? { index: 0, message: assistant, logprobs: null, finish_reason: finish }
        : { index: 0, text, logprobs: null, finish_reason: finish },
    ],
  };
  if (usage) json.usage = openAiUsage(usage, message.usage);
  return { json, usage };
}

/**
 * A decoder of one Messages API stream (its events' `data:` payloads, each naming its `type`)
 * into the router's chunks: a chunk per text delta, each with the counts so far (the exact input
 * of message_start and one output token per text chunk, as the router counts, so a stream cut
 * short is billed what it produced), a finish chunk at message_delta, and at message_stop the
 * usage chunk (no choices) with the upstream's final counts. On chat, the role chunk goes out
 * with the first text (or the finish), not at message_start: until the caller has seen a chunk
 * the attempt may still fail over (an overloaded error event right after message_start), and the
 * first-token timeout runs until the first token. ping and block boundaries yield nothing; an
 * error event fails the attempt as its error type says.
 */
export function streamDecoder(req: ProviderRequest): (data: string) => DecodedEvent {
  const chat = req.operation === "chat";
  let head: Record<string, unknown> = { id: "", object: "", created: 0, model: req.body.model };
  let input: Record<string, unknown> = {};
  /** message_delta's output count; undefined until then, or when it gave none. */
  let output: number | undefined;
  /** Text chunks so far: the output tokens counted until the upstream's own count comes. */
  let pieces = 0;
  let finish: string | undefined;
  let roleSent = !chat;
  const chunk = (choice: Record<string, unknown>, usage?: TokenCounts): ProviderChunk => ({
    json: { ...head, choices: [{ index: 0, ...choice, logprobs: null }] },
    usage,
  });
  /** The counts so far: the exact input, one output token per text chunk; none without an input count. */
  const soFar = (): TokenCounts | undefined => {
    const inputTokens = inputOf(input);
    return inputTokens === undefined ? undefined : { inputTokens, outputTokens: pieces, reasoningTokens: 0 };
  };
  const withRole = (next: ProviderChunk): DecodedEvent => {
    if (roleSent) return { chunks: [next], done: false };
    roleSent = true;
    // The counts ride on the chunk it goes with.
    const role = chunk({ delta: { role: "assistant", content: "" }, finish_reason: null });
    return { chunks: [role, next], done: false };
  };
  const piece = (text: string, field: "content" | "reasoning_content") => {
    pieces++;
    return withRole(
      chat
        ? chunk({ delta: { [field]: text }, finish_reason: null }, soFar())
        : chunk({ text, finish_reason: null }, soFar()),
    );
  };
  const none: DecodedEvent = { chunks: [], done: false };

  return (data) => {
    let event: Record<string, unknown>;
    try {
      event = JSON.parse(data) as Record<string, unknown>;
    } catch {
      throw unreadable();
    }
    switch (event.type) {
      case "message_start": {
        const message = (event.message ?? {}) as Record<string, unknown>;
        head = {
          id: typeof message.id === "string" ? message.id : "",
          object: chat ? "chat.completion.chunk" : "text_completion",
          created: Math.floor(Date.now() / 1000),
          model: message.model ?? req.body.model,
        };
        input = (message.usage ?? {}) as Record<string, unknown>;
        return none;
      }
      case "content_block_delta": {
        const delta = (event.delta ?? {}) as Record<string, unknown>;
        if (delta.type === "text_delta" && typeof delta.text === "string")
          return piece(delta.text, "content");
        if (chat && delta.type === "thinking_delta" && typeof delta.thinking === "string")
          return piece(delta.thinking, "reasoning_content");
        return none;
      }
      case "message_delta": {
        const delta = (event.delta ?? {}) as Record<string, unknown>;
        const usage = (event.usage ?? {}) as Record<string, unknown>;
        output = tokenCount(usage.output_tokens);
        // Newer API versions repeat the input counts here; they win when given (as a count).
        if (tokenCount(usage.input_tokens) !== undefined) input = { ...input, ...usage };
        finish = finishReason(delta.stop_reason);
        return withRole(
          chat ? chunk({ delta: {}, finish_reason: finish }) : chunk({ text: "", finish_reason: finish }),
        );
      }
      case "message_stop": {
        // A stream stopped before its message_delta has no final counts: it is unfinished.
        if (finish === undefined) throw unreadable();
        const rawUsage = { ...input, output_tokens: output };
        // Counts that are not counts are none: the usage chunk goes without, the router estimates.
        const usage = anthropicUsage(rawUsage);
        const json = { ...head, choices: [], ...(usage ? { usage: openAiUsage(usage, rawUsage) } : {}) };
        return { chunks: [{ json, usage }], done: true };
      }
      case "error":
        throw errorEventFailure(event.error);
      default:
        // ping, content_block_start, content_block_stop, and event types added later.
        return none;
    }
  };
}

/** Token counts in OpenAI's usage shape, the cache reads as `prompt_tokens_details.cached_tokens`. */
function openAiUsage(usage: TokenCounts, raw: unknown): Record<string, unknown> {
  const cached = tokenCount((raw as Record<string, unknown> | null)?.cache_read_input_tokens) ?? 0;
  return {
    prompt_tokens: usage.inputTokens,
    completion_tokens: usage.outputTokens,
    total_tokens: usage.inputTokens + usage.outputTokens,
    ...(cached > 0 ? { prompt_tokens_details: { cached_tokens: cached } } : {}),
  };
}

/** A token count: a non-negative safe integer; anything else is none. */
function tokenCount(v: unknown): number | undefined {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0 ? v : undefined;
}
