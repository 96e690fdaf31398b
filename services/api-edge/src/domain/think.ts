import type { ChatAnswer, TokenUsage } from "./chat-answer.js";

// The shapes below are what the translation reads and writes. schemas/think.ts validates the
// wire format; its parsed request fits ThinkRequest and ThinkResponse fits its response schema
// (both checked by the type checker: the route, and think.test.ts).

/** The fields of a validated think request the translation reads. */
export interface ThinkRequest {
  /** Chat messages, passed on as they are; absent when `prompt` is given. */
  messages?: readonly unknown[] | null | undefined;
  prompt?: string | null | undefined;
  reasoning_effort?: "low" | "medium" | "high" | null | undefined;
  temperature?: number | null | undefined;
}

/** The answer of POST /v1/think. */
export interface ThinkResponse {
  id: string;
  object: "think";
  /** Unix seconds. */
  created: number;
  model: string;
  answer: string;
  reasoning: string | null;
  finish_reason: string | null;
  usage: { input_tokens: number; output_tokens: number; reasoning_tokens: number; total_tokens: number };
}

/**
 * The chat request a think request stands for: `prompt` becomes one user message and
 * `reasoning_effort` is passed on for upstreams that take it.
 */
export function chatBodyFromThink(
  req: ThinkRequest,
  model: string,
  maxOutputTokens: number | undefined,
): Record<string, unknown> {
  return {
    model,
    messages: req.messages ?? [{ role: "user", content: req.prompt ?? "" }],
    ...(maxOutputTokens !== undefined ? { max_tokens: maxOutputTokens } : {}),
    ...(req.temperature != null ? { temperature: req.temperature } : {}),
    ...(req.reasoning_effort != null ? { reasoning_effort: req.reasoning_effort } : {}),
  };
}

/** A chat answer as the think response: the answer and the reasoning apart, usage with reasoning tokens. */
export function thinkFromChat(
  answer: ChatAnswer,
  usage: TokenUsage,
  labels: { id: string; model: string; now: number },
): ThinkResponse {
  return {
    id: labels.id,
    object: "think",
    created: answer.created ?? labels.now,
    model: labels.model,
    answer: answer.text,
    reasoning: answer.reasoning,
    finish_reason: answer.finishReason,
    usage: {
      input_tokens: usage.inputTokens,
      output_tokens: usage.outputTokens,
      reasoning_tokens: usage.reasoningTokens,
      total_tokens: usage.inputTokens + usage.outputTokens,
    },
  };
}
