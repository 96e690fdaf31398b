import { errors, Pool } from "undici";
import { type AttemptFailure, InferenceError } from "../../domain/errors.js";
import type {
  ProbeTarget,
  Provider,
  ProviderChunk,
  ProviderRequest,
  TokenCounts,
} from "../../domain/ports.js";
import { parseSse } from "./sse.js";
import { tracedRequest } from "./traced-request.js";

/** Per-attempt timeouts of one upstream, by phase (configuration `resilience.timeouts`). */
export interface UpstreamTimeouts {
  connectMs: number;
  /** Until the first byte of a buffered answer, or the first chunk of a stream. */
  firstTokenMs: number;
  /** Silence allowed between two body chunks once the answer is under way. */
  idleMs: number;
  totalMs: number;
}

/** Settings of one OpenAI-compatible upstream. */
export interface OpenAICompatibleOptions {
  id: string;
  /** Base URL ending in /v1. */
  baseUrl: string;
  apiKey?: string;
  timeouts: UpstreamTimeouts;
}

const MAX_ERROR_TEXT = 500;

/** The probe's prompt: fixed, so that no caller's input decides whether an upstream is cooled down. */
export const PROBE_PROMPT = "Say OK.";

/** Why this adapter aborted an attempt itself. */
class AttemptTimeout extends Error {
  constructor(readonly kind: "timeout" | "idle_timeout" | "total_timeout") {
    super(kind);
  }
}

/**
 * The clock of one attempt: aborts it when the caller goes away, when the current phase's
 * timeout passes (first token, then idle between chunks) or when its total time is up.
 */
class AttemptClock {
  readonly #controller = new AbortController();
  readonly #caller: AbortSignal;
  readonly #onCallerAbort = () => this.#controller.abort(this.#caller.reason);
  readonly #total: NodeJS.Timeout;
  #phase: NodeJS.Timeout | undefined;

  constructor(caller: AbortSignal, timeouts: UpstreamTimeouts, timeLeftMs: number | undefined) {
    this.#caller = caller;
    if (caller.aborted) this.#controller.abort(caller.reason);
    else caller.addEventListener("abort", this.#onCallerAbort, { once: true });
    const totalMs = Math.max(1, Math.min(timeouts.totalMs, timeLeftMs ?? timeouts.totalMs));
    this.#total = setTimeout(() => this.#abort("total_timeout"), totalMs);
    this.#phase = setTimeout(() => this.#abort("timeout"), timeouts.firstTokenMs);
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** The answer moved on: from now the idle timeout runs until the next call. */
  progress(idleMs: number): void {
    clearTimeout(this.#phase);
    this.#phase = setTimeout(() => this.#abort("idle_timeout"), idleMs);
  }

  end(): void {
    clearTimeout(this.#total);
    clearTimeout(this.#phase);
    this.#caller.removeEventListener("abort", this.#onCallerAbort);
  }

  /** The attempt's own timeout that aborted it, if any (never when the caller went away). */
  timedOut(): AttemptTimeout | undefined {
    const reason: unknown = this.#controller.signal.reason;
    return !this.#caller.aborted && reason instanceof AttemptTimeout ? reason : undefined;
  }

  #abort(kind: AttemptTimeout["kind"]): void {
    this.#controller.abort(new AttemptTimeout(kind));
  }
}

/** One OpenAI-compatible upstream: its attempts, its probe, and its connections to close. */
export interface OpenAICompatibleProvider extends Provider {
  /**
   * One probe of the upstream (the UpstreamProbe port): a buffered one-token completion of
   * PROBE_PROMPT for the target's model and route, under the connect and first-token timeouts;
   * undefined when it was answered 2xx, otherwise how it failed. Outside any request's trace.
   */
  probe(target: ProbeTarget): Promise<AttemptFailure | undefined>;
  close(): Promise<void>;
}

/**
 * Any upstream speaking OpenAI's /chat/completions and /completions: vLLM, Ollama, llama.cpp
 * server, OpenAI and friends. One keep-alive connection pool per upstream. Each call is one
 * attempt at one upstream; retries and failover are the failover provider's business.
 */
export function createOpenAICompatibleProvider(opts: OpenAICompatibleOptions): OpenAICompatibleProvider {
  const url = new URL(opts.baseUrl);
  const basePath = url.pathname.replace(/\/+$/, "");
  const { timeouts } = opts;
  const pool = new Pool(url.origin, {
    connections: 128,
    keepAliveTimeout: 30_000,
    connect: { timeout: timeouts.connectMs },
    // The attempt clock enforces the phase timeouts; these are only a backstop.
    headersTimeout: timeouts.totalMs,
    bodyTimeout: timeouts.totalMs,
  });
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (opts.apiKey) headers.authorization = `Bearer ${opts.apiKey}`;

  /** The one HTTP call of an attempt: resolves once the upstream's status and headers arrived. */
  async function send(req: ProviderRequest, clock: AttemptClock, stream: boolean) {
    const path = `${basePath}${PATHS[req.operation]}`;
    const res = await tracedRequest(pool, { id: opts.id, url }, req, {
      path,
      method: "POST",
      headers: stream ? { ...headers, accept: "text/event-stream" } : headers,
      body: JSON.stringify(req.body),
      signal: clock.signal,
    });
    if (res.statusCode >= 400) {
      const text = await res.body.text().catch(() => "");
      throw upstreamStatusError(res.statusCode, text, res.headers["retry-after"]);
    }
    return res;
  }

  return {
    id: opts.id,
    async complete(req, signal) {
      const clock = new AttemptClock(signal, timeouts, req.timeLeftMs);
      let answered = false;
      try {
        const res = await send(req, clock, false);
        answered = true;
        clock.progress(timeouts.idleMs);
        const parts: Buffer[] = [];
        for await (const part of res.body) {
          parts.push(part as Buffer);
          clock.progress(timeouts.idleMs);
        }
        let json: Record<string, unknown>;
        try {
          json = JSON.parse(Buffer.concat(parts).toString("utf8")) as Record<string, unknown>;
        } catch {
          throw failure("upstream_error", "the upstream sent an unreadable answer", "interrupted");
        }
        return { json, usage: normaliseUsage(json.usage) };
      } catch (err) {
        throw translate(err, signal, clock, answered);
      } finally {
        clock.end();
      }
    },
    async *stream(req, signal): AsyncGenerator<ProviderChunk> {
      const clock = new AttemptClock(signal, timeouts, req.timeLeftMs);
      let answered = false;
      let body: (AsyncIterable<Uint8Array> & { destroy(): unknown }) | undefined;
      try {
        const res = await send(req, clock, true);
        answered = true;
        body = res.body;
        let started = false;
        // Until the first chunk the first-token timeout runs; from then, the idle timeout.
        const paced = (async function* () {
          for await (const bytes of res.body) {
            if (started) clock.progress(timeouts.idleMs);
            yield bytes as Uint8Array;
          }
        })();
        for await (const data of parseSse(paced)) {
          if (data === "[DONE]") return;
          let json: Record<string, unknown>;
          try {
            json = JSON.parse(data) as Record<string, unknown>;
          } catch {
            throw failure("upstream_error", "the upstream sent an unreadable stream event", "interrupted");
          }
          if (json.error !== undefined)
            throw failure("upstream_error", "the upstream failed mid-stream", "interrupted");
          if (!started) {
            started = true;
            clock.progress(timeouts.idleMs);
          }
          yield { json, usage: normaliseUsage(json.usage) };
        }
        if (!signal.aborted)
          throw failure("upstream_error", "the upstream stream ended without [DONE]", "interrupted");
      } catch (err) {
        throw translate(err, signal, clock, answered);
      } finally {
        clock.end();
        body?.destroy();
      }
    },
    async probe(target) {
      const body: Record<string, unknown> =
        target.operation === "chat"
          ? { model: target.model, messages: [{ role: "user", content: PROBE_PROMPT }], max_tokens: 1 }
          : target.operation === "embeddings"
            ? { model: target.model, input: PROBE_PROMPT }
            : { model: target.model, prompt: PROBE_PROMPT, max_tokens: 1 };
      const caller = new AbortController().signal;
      const clock = new AttemptClock(caller, timeouts, timeouts.connectMs + timeouts.firstTokenMs);
      let answered = false;
      try {
        const res = await pool.request({
          path: `${basePath}${PATHS[target.operation]}`,
          method: "POST",
          headers,
          body: JSON.stringify(body),
          signal: clock.signal,
        });
        answered = true;
        const text = await res.body.text();
        if (res.statusCode >= 400)
          throw upstreamStatusError(res.statusCode, text, res.headers["retry-after"]);
        return undefined;
      } catch (err) {
        const failed = translate(err, caller, clock, answered);
        return failed instanceof InferenceError && failed.upstream ? failed.upstream.kind : "interrupted";
      } finally {
        clock.end();
      }
    },
    close: () => pool.close(),
  };
}

/** The upstream path of each operation, under the upstream's base URL. */
const PATHS = {
  chat: "/chat/completions",
  text: "/completions",
  embeddings: "/embeddings",
} as const satisfies Record<ProviderRequest["operation"], string>;

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

/**
 * An HTTP Retry-After value (delay in seconds, or an HTTP date) in milliseconds from `now`;
 * undefined when absent or unreadable, 0 for a date already past.
 */
export function parseRetryAfter(value: string | string[] | undefined, now = Date.now()): number | undefined {
  const raw = (Array.isArray(value) ? value[0] : value)?.trim();
  if (!raw) return undefined;
  if (/^\d+$/.test(raw)) return Number(raw) * 1000;
  // An HTTP date names its weekday and month ("Wed, 21 Oct 2015 07:28:00 GMT").
  if (!/^[A-Za-z]{3}, /.test(raw)) return undefined;
  const at = Date.parse(raw);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

function failure(
  code: "upstream_error" | "upstream_timeout" | "upstream_rejected",
  message: string,
  kind: AttemptFailure,
  retryAfterMs?: number,
): InferenceError {
  return new InferenceError(code, message, { kind, ...(retryAfterMs !== undefined ? { retryAfterMs } : {}) });
}

function upstreamStatusError(
  status: number,
  text: string,
  retryAfter: string | string[] | undefined,
): InferenceError {
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
    return failure(
      "upstream_rejected",
      message || `the upstream refused the request (${status})`,
      "status_4xx",
    );
  }
  // 408 is the upstream's own timeout waiting for the request: a first-byte timeout.
  const kind: AttemptFailure =
    status === 429 ? "status_429" : status >= 500 ? "status_5xx" : status === 408 ? "timeout" : "status_auth";
  const retryAfterMs = status === 429 || status === 503 ? parseRetryAfter(retryAfter) : undefined;
  return failure("upstream_error", `the upstream answered ${status}`, kind, retryAfterMs);
}

function translate(err: unknown, signal: AbortSignal, clock: AttemptClock, answered: boolean): unknown {
  if (err instanceof InferenceError || signal.aborted) return err;
  const timeout = clock.timedOut();
  if (timeout) return failure("upstream_timeout", "the upstream did not answer in time", timeout.kind);
  if (err instanceof errors.HeadersTimeoutError)
    return failure("upstream_timeout", "the upstream did not answer in time", "timeout");
  if (err instanceof errors.BodyTimeoutError)
    return failure("upstream_timeout", "the upstream did not answer in time", "idle_timeout");
  if (!answered && connectionNotOpened(err))
    return failure("upstream_error", "the upstream could not be reached", "connect_error");
  // The request went out, then the connection broke: the request itself may be what broke it.
  return failure(
    "upstream_error",
    answered ? "the upstream's answer broke off" : "the upstream closed the connection without answering",
    "interrupted",
  );
}

/**
 * Whether the error came before the request went out: the connection could not be opened
 * (refused, reset while connecting, unreachable, unknown host, connect timeout).
 */
function connectionNotOpened(err: unknown): boolean {
  if (err instanceof errors.ConnectTimeoutError) return true;
  const syscall = (err as { syscall?: unknown } | null)?.syscall;
  return syscall === "connect" || syscall === "getaddrinfo";
}
