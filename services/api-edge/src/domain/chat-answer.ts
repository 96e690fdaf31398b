/** Token counts of one completion, as the inference router reports (and bills) them. */
export interface TokenUsage {
  inputTokens: number;
  /** Every generated token, reasoning included. */
  outputTokens: number;
  reasoningTokens: number;
}

/** What the translated routes read from an upstream chat completion. */
export interface ChatAnswer {
  /** Unix seconds, when the upstream said. */
  created: number | undefined;
  text: string;
  /** Reasoning text; null when the upstream returned none. */
  reasoning: string | null;
  finishReason: string | null;
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** Message content as text: a string, or the text of its text parts. */
function textOf(content: unknown): string | null {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return null;
  const texts = content.flatMap((p) => (isObject(p) && typeof p.text === "string" ? [p.text] : []));
  return texts.length > 0 ? texts.join("") : null;
}

/**
 * Reads the first choice of an OpenAI chat completion. Reasoning comes from
 * `reasoning_content` (DeepSeek, vLLM, llama.cpp) or `reasoning` (newer vLLM, OpenRouter).
 */
export function readChatAnswer(json: unknown): ChatAnswer {
  const body = isObject(json) ? json : {};
  const choice = Array.isArray(body.choices) && isObject(body.choices[0]) ? body.choices[0] : {};
  const message = isObject(choice.message) ? choice.message : {};
  const reasoning = textOf(message.reasoning_content) ?? textOf(message.reasoning);
  return {
    created: typeof body.created === "number" ? body.created : undefined,
    text: textOf(message.content) ?? "",
    reasoning: reasoning === "" ? null : reasoning,
    finishReason: typeof choice.finish_reason === "string" ? choice.finish_reason : null,
  };
}
