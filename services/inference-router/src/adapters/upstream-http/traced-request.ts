import {
  ATTR,
  activeSpan,
  failSpan,
  genAiOperation,
  injectHeaders,
  type Span,
  SpanKind,
  startSpan,
  tracingEnabled,
} from "@tollgate/kit/tracing";
import type { Dispatcher, Pool } from "undici";
import type { ProviderRequest } from "../../domain/ports.js";

/** One upstream HTTP request as the provider sends it: JSON headers, a path, a body. */
type UpstreamRequestOptions = Dispatcher.RequestOptions & { headers: Record<string, string> };

/**
 * The upstream a request goes to: its id, its URL, and the wire format it speaks, recorded as
 * gen_ai.provider.name per the conventions ("openai" for every OpenAI-compatible server: vLLM,
 * Ollama and llama.cpp server all speak it; "anthropic" for the Messages API).
 */
export interface TracedUpstream {
  id: string;
  url: URL;
  provider: "openai" | "anthropic";
}

/** Upstream calls made so far under each request span, so retries and failovers count up. */
const attempts = new WeakMap<Span, number>();

/**
 * Sends one upstream HTTP request (one attempt) inside a GenAI client span, a child of the
 * router's request span: a W3C traceparent header, server.address/port, the status code, the
 * upstream model id, and `upstream.attempt`, the 1-based count of upstream calls this request
 * has made so far. The span ends with the response body, so a stream's span lasts until the
 * stream ends. Tracing off: `pool.request`.
 */
export function tracedRequest(
  pool: Pool,
  upstream: TracedUpstream,
  req: ProviderRequest,
  options: UpstreamRequestOptions,
): Promise<Dispatcher.ResponseData> {
  if (!tracingEnabled()) return pool.request(options);
  return send(pool, upstream, req, options);
}

async function send(
  pool: Pool,
  upstream: TracedUpstream,
  req: ProviderRequest,
  options: UpstreamRequestOptions,
): Promise<Dispatcher.ResponseData> {
  const parent = activeSpan();
  const attempt = (parent ? (attempts.get(parent) ?? 0) : 0) + 1;
  if (parent) attempts.set(parent, attempt);
  const operation = genAiOperation(req.operation);
  const model = typeof req.body.model === "string" ? req.body.model : undefined;
  const cap = req.body.max_completion_tokens ?? req.body.max_tokens;
  const { url } = upstream;
  const span = startSpan(model ? `${operation} ${model}` : operation, SpanKind.CLIENT, {
    [ATTR.genAiOperation]: operation,
    [ATTR.genAiProvider]: upstream.provider,
    [ATTR.genAiSystem]: upstream.provider,
    ...(model ? { [ATTR.genAiRequestModel]: model } : {}),
    ...(typeof cap === "number" ? { [ATTR.genAiMaxTokens]: cap } : {}),
    [ATTR.httpMethod]: options.method,
    [ATTR.serverAddress]: url.hostname,
    [ATTR.serverPort]: Number(url.port) || (url.protocol === "https:" ? 443 : 80),
    [ATTR.upstream]: upstream.id,
    [ATTR.upstreamAttempt]: attempt,
  });
  const headers = { ...options.headers };
  injectHeaders(headers, span);
  try {
    const res = await pool.request({ ...options, headers });
    span.setAttribute(ATTR.httpStatus, res.statusCode);
    if (res.statusCode >= 400) failSpan(span, String(res.statusCode));
    // Read to the end ("end", before the reader sees the result) or dropped ("close": a stream
    // the router stops reading after [DONE], or a caller that went away): whichever is first.
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      span.end();
    };
    res.body.once("end", end);
    res.body.once("close", end);
    return res;
  } catch (err) {
    const signal = options.signal as AbortSignal | undefined;
    // undici's error codes (UND_ERR_HEADERS_TIMEOUT, UND_ERR_SOCKET, ...) are a closed set.
    const code = (err as { code?: unknown }).code;
    failSpan(span, signal?.aborted ? "cancelled" : typeof code === "string" ? code : "error");
    span.end();
    throw err;
  }
}
