import type { ThinkRequest, ThinkResponse } from "../schemas/think.js";
import type { ChatAnswer, TokenUsage } from "./chat-answer.js";

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
