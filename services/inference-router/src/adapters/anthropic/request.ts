import { InferenceError } from "../../domain/errors.js";
import type { ProviderRequest } from "../../domain/ports.js";

/**
 * The router's request (an OpenAI chat or text-completion body, the upstream model id and the
 * gateway's output cap already set) as an Anthropic Messages API body: system and developer
 * messages lifted into `system`, the cap as `max_tokens` (the API requires one), `stop` as
 * `stop_sequences`, temperature and top_p as they are, `user` as `metadata.user_id`.
 * What the Messages API cannot do is refused here, before any call, with `invalid_request`.
 */
export function messagesBody(req: ProviderRequest, stream: boolean): Record<string, unknown> {
  const b = req.body;
  if (req.operation === "embeddings") refuse("embeddings");
  for (const field of UNSUPPORTED) {
    if (b[field] !== undefined && b[field] !== null) refuse(`\`${field}\``);
  }
  if (numberOr(b.n, 1) !== 1) refuse("more than one choice (`n` above 1)");
  if (numberOr(b.best_of, 1) !== 1) refuse("`best_of` above 1");
  if (b.logprobs !== undefined && b.logprobs !== null && b.logprobs !== false && b.logprobs !== 0)
    refuse("`logprobs`");
  if (b.echo === true) refuse("`echo`");
  for (const penalty of ["presence_penalty", "frequency_penalty"] as const) {
    if (numberOr(b[penalty], 0) !== 0) refuse(`\`${penalty}\``);
  }
  const format = b.response_format as { type?: unknown } | undefined | null;
  if (format && format.type !== "text") refuse("`response_format` other than text");
  const temperature = b.temperature;
  if (typeof temperature === "number" && temperature > 1) refuse("a temperature above 1");

  const cap = b.max_tokens ?? b.max_completion_tokens;
  if (typeof cap !== "number" || !Number.isInteger(cap) || cap < 1) {
    throw new InferenceError(
      "invalid_request",
      "this model's upstream speaks the Anthropic Messages API, which needs an output cap: send max_tokens",
    );
  }
  const { system, messages } = req.operation === "chat" ? fromChat(b.messages) : fromPrompt(b.prompt);
  const out: Record<string, unknown> = { model: b.model, max_tokens: cap, messages };
  if (system.length === 1) out.system = system[0]!.text;
  else if (system.length > 1) out.system = system;
  const stop = typeof b.stop === "string" ? [b.stop] : Array.isArray(b.stop) ? b.stop : [];
  if (stop.length > 0) out.stop_sequences = stop;
  if (typeof temperature === "number") out.temperature = temperature;
  if (typeof b.top_p === "number") out.top_p = b.top_p;
  if (typeof b.user === "string" && b.user !== "") out.metadata = { user_id: b.user };
  if (stream) out.stream = true;
  return out;
}

/** OpenAI fields the Messages API has no equivalent for (tools are not translated yet). */
const UNSUPPORTED = [
  "tools",
  "tool_choice",
  "functions",
  "function_call",
  "logit_bias",
  "top_logprobs",
  "suffix",
  "audio",
  "prediction",
] as const;

type TextBlock = { type: "text"; text: string };
type AnthropicMessage = { role: "user" | "assistant"; content: string | TextBlock[] };

function fromChat(raw: unknown): { system: TextBlock[]; messages: AnthropicMessage[] } {
  const system: TextBlock[] = [];
  const messages: AnthropicMessage[] = [];
  for (const m of Array.isArray(raw) ? raw : []) {
    const { role, content, tool_calls: toolCalls } = (m ?? {}) as Record<string, unknown>;
    if (role === "system" || role === "developer") {
      const text = textOf(content);
      if (text !== "") system.push({ type: "text", text });
    } else if (role === "user" || role === "assistant") {
      if (toolCalls !== undefined && toolCalls !== null) refuse("tool calls");
      messages.push({ role, content: typeof content === "string" ? content : blocksOf(content) });
    } else {
      refuse(`messages of role '${String(role)}'`);
    }
  }
  if (messages.length === 0) {
    throw new InferenceError(
      "invalid_request",
      "this model's upstream speaks the Anthropic Messages API, which needs a user or assistant message",
    );
  }
  return { system, messages };
}

/** A text completion's prompt: one user message (a list of one prompt is that prompt). */
function fromPrompt(raw: unknown): { system: TextBlock[]; messages: AnthropicMessage[] } {
  if (Array.isArray(raw) && raw.length > 0 && raw.every((t) => typeof t === "number"))
    refuse("prompts given as token ids");
  const prompt = Array.isArray(raw) && raw.length === 1 ? raw[0] : raw;
  if (Array.isArray(prompt)) refuse("a list of prompts");
  if (typeof prompt !== "string") refuse("prompts given as token ids");
  return { system: [], messages: [{ role: "user", content: prompt }] };
}

/** Content parts: text only (images, audio and files are not translated). */
function blocksOf(content: unknown): TextBlock[] {
  if (!Array.isArray(content)) refuse("message content that is neither text nor text parts");
  return content.map((part: unknown) => {
    const p = (part ?? {}) as { type?: unknown; text?: unknown };
    if (p.type !== "text" || typeof p.text !== "string") refuse(`content parts of type '${String(p.type)}'`);
    return { type: "text", text: p.text };
  });
}

function textOf(content: unknown): string {
  return typeof content === "string"
    ? content
    : blocksOf(content)
        .map((b) => b.text)
        .join("\n");
}

function numberOr(v: unknown, fallback: number): unknown {
  return v === undefined || v === null ? fallback : v;
}

function refuse(what: string): never {
  throw new InferenceError(
    "invalid_request",
    `this model's upstream speaks the Anthropic Messages API, which does not support ${what}`,
  );
}
