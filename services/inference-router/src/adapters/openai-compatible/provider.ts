import type { ProviderRequest, TokenCounts } from "../../domain/ports.js";
import {
  attemptFailure,
  createHttpProvider,
  type HttpProvider,
  PROBE_PROMPT,
  statusFailure,
  type UpstreamTimeouts,
  upstreamPath,
  type WireFormat,
} from "../upstream-http/http-provider.js";

export { PROBE_PROMPT, parseRetryAfter, type UpstreamTimeouts } from "../upstream-http/http-provider.js";

/** Settings of one OpenAI-compatible upstream. */
export interface OpenAICompatibleOptions {
  id: string;
  /** Base URL ending in /v1. */
  baseUrl: string;
  apiKey?: string;
  timeouts: UpstreamTimeouts;
}

/** One OpenAI-compatible upstream: its attempts, its probe, and its connections to close. */
export type OpenAICompatibleProvider = HttpProvider;

/** The upstream path of each operation, under the upstream's base URL. */
const PATHS = {
  chat: "/chat/completions",
  text: "/completions",
  embeddings: "/embeddings",
} as const satisfies Record<ProviderRequest["operation"], string>;

/**
 * Any upstream speaking OpenAI's /chat/completions, /completions and /embeddings: vLLM, Ollama,
 * llama.cpp server, OpenAI and friends. The router's body goes as it is; the answer comes back
 * as it is, its usage read.
 */
export function createOpenAICompatibleProvider(opts: OpenAICompatibleOptions): OpenAICompatibleProvider {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (opts.apiKey) headers.authorization = `Bearer ${opts.apiKey}`;
  // The base URL's path, parsed once per upstream rather than on every request's way out.
  const base = upstreamPath(opts.baseUrl, "");
  const pathOf = (operation: ProviderRequest["operation"]) => `${base}${PATHS[operation]}`;
  const wire: WireFormat = {
    provider: "openai",
    headers,
    call: (req) => ({ path: pathOf(req.operation), body: req.body }),
    probe: (target) => ({
      path: pathOf(target.operation),
      body:
        target.operation === "chat"
          ? { model: target.model, messages: [{ role: "user", content: PROBE_PROMPT }], max_tokens: 1 }
          : target.operation === "embeddings"
            ? { model: target.model, input: PROBE_PROMPT }
            : { model: target.model, prompt: PROBE_PROMPT, max_tokens: 1 },
    }),
    answer: (json, req) => ({ json, usage: normaliseUsage(json.usage, req.operation) }),
    decoder: (req) => (data) => {
      if (data === "[DONE]") return { chunks: [], done: true };
      let json: Record<string, unknown>;
      try {
        json = JSON.parse(data) as Record<string, unknown>;
      } catch {
        throw attemptFailure("upstream_error", "the upstream sent an unreadable stream event", "interrupted");
      }
      if (json.error !== undefined)
        throw attemptFailure("upstream_error", "the upstream failed mid-stream", "interrupted");
      return { chunks: [{ json, usage: normaliseUsage(json.usage, req.operation) }], done: false };
    },
    statusError: (status, text, retryAfter) => statusFailure(status, text, retryAfter, [429, 503]),
  };
  return createHttpProvider(opts, wire);
}

/**
 * OpenAI usage → token counts; undefined when the upstream sent none, and when what it sent is
 * not a count (docs/spend.md, "Without a count from the upstream"): a prompt_tokens that is not
 * a non-negative integer, a completion_tokens that is given but not one, or none on a chat or
 * text completion (an embedding has no output). The domain then estimates, so an upstream that
 * misreports (negative, fractional, a string) cannot serve a request free. reasoning_tokens is
 * a part of completion_tokens, never priced on its own (costOf prices input and output): an
 * invalid one is reported as 0.
 */
export function normaliseUsage(
  raw: unknown,
  operation: ProviderRequest["operation"],
): TokenCounts | undefined {
  if (typeof raw !== "object" || raw === null) return undefined;
  const u = raw as Record<string, unknown>;
  const inputTokens = tokenCount(u.prompt_tokens);
  if (inputTokens === undefined) return undefined;
  const given = u.completion_tokens !== undefined && u.completion_tokens !== null;
  const outputTokens = given || operation !== "embeddings" ? tokenCount(u.completion_tokens) : 0;
  if (outputTokens === undefined) return undefined;
  const details = (u.completion_tokens_details ?? {}) as Record<string, unknown>;
  return { inputTokens, outputTokens, reasoningTokens: tokenCount(details.reasoning_tokens) ?? 0 };
}

/** A token count: a non-negative safe integer; anything else is none. */
function tokenCount(v: unknown): number | undefined {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0 ? v : undefined;
}
