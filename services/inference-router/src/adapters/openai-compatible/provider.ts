import { errors, Pool } from "undici";
import { InferenceError } from "../../domain/errors.js";
import type { Provider, ProviderChunk, ProviderRequest, TokenCounts } from "../../domain/ports.js";
import { parseSse } from "./sse.js";
import { tracedRequest } from "./traced-request.js";

/** Settings of one OpenAI-compatible upstream. */
export interface OpenAICompatibleOptions {
  id: string;
  /** Base URL ending in /v1. */
  baseUrl: string;
  apiKey?: string;
  timeoutMs: number;
}

const MAX_ERROR_TEXT = 500;

/**
 * Any upstream speaking OpenAI's /chat/completions and /completions: vLLM, Ollama, llama.cpp
 * server, OpenAI and friends. One keep-alive connection pool per upstream.
 */
export function createOpenAICompatibleProvider(
  opts: OpenAICompatibleOptions,
): Provider & { close(): Promise<void> } {
  const url = new URL(opts.baseUrl);
  const basePath = url.pathname.replace(/\/+$/, "");
  const pool = new Pool(url.origin, {
    connections: 128,
    keepAliveTimeout: 30_000,
    headersTimeout: opts.timeoutMs,
    bodyTimeout: opts.timeoutMs,
  });
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (opts.apiKey) headers.authorization = `Bearer ${opts.apiKey}`;

  async function send(req: ProviderRequest, signal: AbortSignal, stream: boolean) {
    const path = `${basePath}${req.operation === "chat" ? "/chat/completions" : "/completions"}`;
    try {
      const res = await tracedRequest(pool, { id: opts.id, url }, req, {
        path,
        method: "POST",
        headers: stream ? { ...headers, accept: "text/event-stream" } : headers,
        body: JSON.stringify(req.body),
        signal,
      });
      if (res.statusCode >= 400) {
        const text = await res.body.text().catch(() => "");
        throw upstreamStatusError(res.statusCode, text);
      }
      return res;
    } catch (err) {
      throw translate(err, signal);
    }
  }

  return {
    id: opts.id,
    async complete(req, signal) {
      const res = await send(req, signal, false);
      try {
        const json = (await res.body.json()) as Record<string, unknown>;
        return { json, usage: normaliseUsage(json.usage) };
      } catch (err) {
        throw translate(err, signal);
      }
    },
    async *stream(req, signal): AsyncGenerator<ProviderChunk> {
      const res = await send(req, signal, true);
      try {
        for await (const data of parseSse(res.body)) {
          if (data === "[DONE]") return;
          let json: Record<string, unknown>;
          try {
            json = JSON.parse(data) as Record<string, unknown>;
          } catch {
            throw new InferenceError("upstream_error", "the upstream sent an unreadable stream event");
          }
          if (json.error !== undefined)
            throw new InferenceError("upstream_error", "the upstream failed mid-stream");
          yield { json, usage: normaliseUsage(json.usage) };
        }
        if (!signal.aborted)
          throw new InferenceError("upstream_error", "the upstream stream ended without [DONE]");
      } catch (err) {
        throw translate(err, signal);
      } finally {
        res.body.destroy();
      }
    },
    close: () => pool.close(),
  };
}

/** OpenAI usage → token counts; undefined when the upstream sent none. */
export function normaliseUsage(raw: unknown): TokenCounts | undefined {
  if (typeof raw !== "object" || raw === null) return undefined;
  const u = raw as Record<string, unknown>;
  const n = (v: unknown) => (typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : 0);
  const details = (u.completion_tokens_details ?? {}) as Record<string, unknown>;
  return {
    inputTokens: n(u.prompt_tokens),
    outputTokens: n(u.completion_tokens),
    reasoningTokens: n(details.reasoning_tokens),
  };
}

function upstreamStatusError(status: number, text: string): InferenceError {
  let message = "";
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } };
    if (typeof body.error?.message === "string") message = body.error.message.slice(0, MAX_ERROR_TEXT);
  } catch {
    // Not JSON: the upstream's text is not passed on.
  }
  // 4xx other than auth and throttling means the request itself was refused (context too
  // long, bad parameter): the caller can fix it. Everything else is a gateway-side failure.
  if (status >= 400 && status < 500 && status !== 401 && status !== 403 && status !== 408 && status !== 429) {
    return new InferenceError("upstream_rejected", message || `the upstream refused the request (${status})`);
  }
  return new InferenceError("upstream_error", `the upstream answered ${status}`);
}

function translate(err: unknown, signal: AbortSignal): unknown {
  if (err instanceof InferenceError || signal.aborted) return err;
  if (err instanceof errors.HeadersTimeoutError || err instanceof errors.BodyTimeoutError) {
    return new InferenceError("upstream_timeout", "the upstream did not answer in time");
  }
  return new InferenceError("upstream_error", "the upstream could not be reached");
}
