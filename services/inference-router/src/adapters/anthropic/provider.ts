import {
  createHttpProvider,
  type HttpProvider,
  PROBE_PROMPT,
  type UpstreamTimeouts,
  upstreamPath,
} from "../upstream-http/http-provider.js";
import { anthropicStatusError } from "./errors.js";
import { messagesBody } from "./request.js";
import { completionOf, streamDecoder } from "./response.js";

/** The Messages API version this adapter speaks. */
export const ANTHROPIC_VERSION = "2023-06-01";

/** Settings of one Anthropic upstream. */
export interface AnthropicOptions {
  id: string;
  /** The API's base URL, without /v1 (https://api.anthropic.com); a trailing /v1 is tolerated. */
  baseUrl: string;
  apiKey?: string;
  timeouts: UpstreamTimeouts;
}

/**
 * An upstream speaking Anthropic's Messages API (POST {baseUrl}/v1/messages): the router's chat
 * and single-prompt text completions are translated to it and its answers, streamed or not,
 * back to the router's format with their usage. What the API cannot do is refused before any
 * call (request.ts). Timeouts, connections and tracing are the shared HTTP upstream's.
 */
export function createAnthropicProvider(opts: AnthropicOptions): HttpProvider {
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "anthropic-version": ANTHROPIC_VERSION,
  };
  if (opts.apiKey) headers["x-api-key"] = opts.apiKey;
  const path = upstreamPath(opts.baseUrl.replace(/\/v1\/*$/, ""), "/v1/messages");
  return createHttpProvider(opts, {
    provider: "anthropic",
    headers,
    call: (req, stream) => ({ path, body: messagesBody(req, stream) }),
    probe: (target) => ({
      path,
      body: { model: target.model, max_tokens: 1, messages: [{ role: "user", content: PROBE_PROMPT }] },
    }),
    answer: completionOf,
    decoder: streamDecoder,
    statusError: anthropicStatusError,
  });
}
