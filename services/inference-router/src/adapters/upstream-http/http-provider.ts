import { errors, Pool } from "undici";
import { type AttemptFailure, InferenceError } from "../../domain/errors.js";
import type {
  ProbeTarget,
  Provider,
  ProviderChunk,
  ProviderRequest,
  ProviderResult,
} from "../../domain/ports.js";
import { parseSse } from "./sse.js";
import { type TracedUpstream, tracedRequest } from "./traced-request.js";

/** Per-attempt timeouts of one upstream, by phase (configuration `resilience.timeouts`). */
export interface UpstreamTimeouts {
  connectMs: number;
  /** Until the first byte of a buffered answer, or the first chunk of a stream. */
  firstTokenMs: number;
  /** Silence allowed between two body chunks once the answer is under way. */
  idleMs: number;
  totalMs: number;
}

/** The probe's prompt: fixed, so that no caller's input decides whether an upstream is cooled down. */
export const PROBE_PROMPT = "Say OK.";

const MAX_ERROR_TEXT = 500;

/** One HTTP call to an upstream: where, and the JSON body. */
export interface UpstreamCall {
  /** The path under the upstream's origin. */
  path: string;
  body: Record<string, unknown>;
}

/**
 * What one stream event decoded to: the chunks to hand on (router chunk format), and whether it
 * was the stream's last event.
 */
export interface DecodedEvent {
  chunks: ProviderChunk[];
  done: boolean;
}

/**
 * A wire protocol an upstream speaks: how the router's request (an OpenAI-compatible body) is
 * sent, and how the answer is read back into the router's chat completion / chunk format.
 * Errors it throws are InferenceErrors: a refusal before any call carries no `upstream`.
 */
export interface WireFormat {
  /** gen_ai.provider.name of the upstream's spans. */
  provider: TracedUpstream["provider"];
  /** Headers of every call (content type, credentials, version). */
  headers: Record<string, string>;
  /** The call of one attempt, or a refusal (an InferenceError) before anything is sent. */
  call(req: ProviderRequest, stream: boolean): UpstreamCall;
  /** The call of a probe of `target`: one output token of PROBE_PROMPT. */
  probe(target: ProbeTarget): UpstreamCall;
  /** A buffered answer's JSON, in the router's format, with its usage. */
  answer(json: Record<string, unknown>, req: ProviderRequest): ProviderResult;
  /** A fresh decoder of one stream's `data:` payloads. */
  decoder(req: ProviderRequest): (data: string) => DecodedEvent;
  /** A 4xx or 5xx answer (its body text) as the attempt's failure. */
  statusError(status: number, text: string, retryAfter: string | string[] | undefined): InferenceError;
}

/** Settings of one HTTP upstream. */
export interface HttpUpstreamOptions {
  id: string;
  baseUrl: string;
  timeouts: UpstreamTimeouts;
}

/** One HTTP upstream: its attempts, its probe, and its connections to close. */
export interface HttpProvider extends Provider {
  /**
   * One probe of the upstream (the UpstreamProbe port): a buffered one-token completion of
   * PROBE_PROMPT for the target's model and route, under the connect and first-token timeouts;
   * undefined when it was answered 2xx, otherwise how it failed. Outside any request's trace.
   */
  probe(target: ProbeTarget): Promise<AttemptFailure | undefined>;
  close(): Promise<void>;
}

/** Why an attempt was aborted by its own clock. */
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

/**
 * An upstream reached over HTTP with JSON requests and JSON or SSE answers, speaking `wire`.
 * One keep-alive connection pool per upstream. Each call is one attempt at one upstream under
 * its own clock (connect, first token, idle, total); retries and failover are the failover
 * provider's business.
 */
export function createHttpProvider(opts: HttpUpstreamOptions, wire: WireFormat): HttpProvider {
  const url = new URL(opts.baseUrl);
  const { timeouts } = opts;
  const pool = new Pool(url.origin, {
    connections: 128,
    keepAliveTimeout: 30_000,
    connect: { timeout: timeouts.connectMs },
    // The attempt clock enforces the phase timeouts; these are only a backstop.
    headersTimeout: timeouts.totalMs,
    bodyTimeout: timeouts.totalMs,
  });
  const upstream: TracedUpstream = { id: opts.id, url, provider: wire.provider };
  const credentials = credentialsOf(wire.headers);
  /**
   * A failure whose message goes to the caller (upstream_rejected), cleared of the gateway's
   * credentials: the message as read (after JSON unescaping), whichever way it came (an error
   * status, or an error event of a stream answered 200). Other failures carry no upstream text.
   */
  const scrubbed = (err: unknown): unknown => {
    if (!(err instanceof InferenceError) || err.code !== "upstream_rejected") return err;
    const message = withoutCredentials(err.message, credentials);
    return message === err.message
      ? err
      : new InferenceError(err.code, message, err.upstream, err.retryAfterMs);
  };
  /**
   * The attempt's failure for a 4xx/5xx, its message cleared of the gateway's credentials: in the
   * raw text first (the message is cut at MAX_ERROR_TEXT, which could leave a part of a key the
   * final pass no longer recognises), then in the message as read (a JSON-escaped key).
   */
  const statusError = (status: number, text: string, retryAfter: string | string[] | undefined) =>
    scrubbed(wire.statusError(status, withoutCredentials(text, credentials), retryAfter));
  const streamHeaders = { ...wire.headers, accept: "text/event-stream" };

  /** The one HTTP call of an attempt: resolves once the upstream's status and headers arrived. */
  async function send(req: ProviderRequest, call: UpstreamCall, clock: AttemptClock, stream: boolean) {
    const res = await tracedRequest(pool, upstream, req, {
      path: call.path,
      method: "POST",
      headers: stream ? streamHeaders : wire.headers,
      body: JSON.stringify(call.body),
      signal: clock.signal,
    });
    if (res.statusCode >= 400) {
      const text = await res.body.text().catch(() => "");
      throw statusError(res.statusCode, text, res.headers["retry-after"]);
    }
    return res;
  }

  return {
    id: opts.id,
    async complete(req, signal) {
      // A request the upstream cannot serve is refused before the clock starts.
      const call = wire.call(req, false);
      const clock = new AttemptClock(signal, timeouts, req.timeLeftMs);
      let answered = false;
      try {
        const res = await send(req, call, clock, false);
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
          throw attemptFailure("upstream_error", "the upstream sent an unreadable answer", "interrupted");
        }
        return wire.answer(json, req);
      } catch (err) {
        throw translate(err, signal, clock, answered);
      } finally {
        clock.end();
      }
    },
    async *stream(req, signal): AsyncGenerator<ProviderChunk> {
      const call = wire.call(req, true);
      const decode = wire.decoder(req);
      const clock = new AttemptClock(signal, timeouts, req.timeLeftMs);
      let answered = false;
      let body: (AsyncIterable<Uint8Array> & { destroy(): unknown }) | undefined;
      try {
        const res = await send(req, call, clock, true);
        answered = true;
        body = res.body;
        let started = false;
        // Until the first chunk the first-token timeout runs; from then, the idle timeout,
        // restarted by every piece of the body read (a callback, not one more async generator
        // between the socket and the caller on every chunk: docs/performance.md, "Stream time
        // to first byte").
        const progress = () => {
          if (started) clock.progress(timeouts.idleMs);
        };
        for await (const data of parseSse(res.body, progress)) {
          const { chunks, done } = decode(data);
          for (const chunk of chunks) {
            if (!started) {
              started = true;
              clock.progress(timeouts.idleMs);
            }
            yield chunk;
          }
          if (done) return;
        }
        if (!signal.aborted)
          throw attemptFailure("upstream_error", "the upstream stream ended unfinished", "interrupted");
      } catch (err) {
        throw scrubbed(translate(err, signal, clock, answered));
      } finally {
        clock.end();
        body?.destroy();
      }
    },
    async probe(target) {
      const call = wire.probe(target);
      const caller = new AbortController().signal;
      const clock = new AttemptClock(caller, timeouts, timeouts.connectMs + timeouts.firstTokenMs);
      let answered = false;
      try {
        const res = await pool.request({
          path: call.path,
          method: "POST",
          headers: wire.headers,
          body: JSON.stringify(call.body),
          signal: clock.signal,
        });
        answered = true;
        const text = await res.body.text();
        if (res.statusCode >= 400) throw statusError(res.statusCode, text, res.headers["retry-after"]);
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

/** The path under the base URL's origin: the base URL's own path, then `path`. */
export function upstreamPath(baseUrl: string, path: string): string {
  return `${new URL(baseUrl).pathname.replace(/\/+$/, "")}${path}`;
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

/** Header names whose values are the gateway's credentials at an upstream. */
const CREDENTIAL_HEADERS = new Set(["authorization", "x-api-key", "api-key"]);

/**
 * The secrets among an upstream's call headers: each credential header's value, and its token
 * without the scheme ("Bearer sk-..." gives "sk-..."). Values too short to be a secret are left out.
 */
export function credentialsOf(headers: Record<string, string>): string[] {
  const found = new Set<string>();
  for (const [name, value] of Object.entries(headers)) {
    if (!CREDENTIAL_HEADERS.has(name.toLowerCase())) continue;
    const token = value.trim().split(/\s+/).at(-1) ?? "";
    for (const secret of [value.trim(), token]) if (secret.length >= 8) found.add(secret);
  }
  // Longest first: the whole value goes before the token inside it.
  return [...found].sort((a, b) => b.length - a.length);
}

/**
 * `text` with every credential replaced by "[redacted]": an upstream's error message is passed on
 * to the caller (upstream_rejected) and must never carry the gateway's key, even when the
 * upstream echoes the request's headers.
 */
export function withoutCredentials(text: string, credentials: readonly string[]): string {
  let out = text;
  for (const secret of credentials) out = out.replaceAll(secret, "[redacted]");
  return out;
}

/** A failed attempt, as the failover policy reads it. */
export function attemptFailure(
  code: "upstream_error" | "upstream_timeout" | "upstream_rejected",
  message: string,
  kind: AttemptFailure,
  retryAfterMs?: number,
): InferenceError {
  return new InferenceError(code, message, { kind, ...(retryAfterMs !== undefined ? { retryAfterMs } : {}) });
}

/**
 * How an upstream's error status fails the attempt (both wire formats put the reason in
 * `error.message`): 4xx other than auth, 408 and 429 means the request itself was refused
 * (context too long, bad parameter, unknown model): the caller can fix it and it is not retried.
 * Everything else is the gateway's side: 401/403 its credentials, 408 a first-byte timeout, 429
 * throttling, 5xx (Anthropic's 529 "overloaded" included) a server failure. `retryAfterStatuses`
 * are the statuses whose Retry-After header is honoured.
 */
export function statusFailure(
  status: number,
  text: string,
  retryAfter: string | string[] | undefined,
  retryAfterStatuses: readonly number[],
): InferenceError {
  let message = "";
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } };
    if (typeof body.error?.message === "string") message = body.error.message.slice(0, MAX_ERROR_TEXT);
  } catch {
    // Not JSON: the upstream's text is not passed on.
  }
  if (status >= 400 && status < 500 && status !== 401 && status !== 403 && status !== 408 && status !== 429) {
    return attemptFailure(
      "upstream_rejected",
      message || `the upstream refused the request (${status})`,
      "status_4xx",
    );
  }
  const kind: AttemptFailure =
    status === 429 ? "status_429" : status >= 500 ? "status_5xx" : status === 408 ? "timeout" : "status_auth";
  const retryAfterMs = retryAfterStatuses.includes(status) ? parseRetryAfter(retryAfter) : undefined;
  return attemptFailure("upstream_error", `the upstream answered ${status}`, kind, retryAfterMs);
}

function translate(err: unknown, signal: AbortSignal, clock: AttemptClock, answered: boolean): unknown {
  if (err instanceof InferenceError || signal.aborted) return err;
  const timeout = clock.timedOut();
  if (timeout) return attemptFailure("upstream_timeout", "the upstream did not answer in time", timeout.kind);
  if (err instanceof errors.HeadersTimeoutError)
    return attemptFailure("upstream_timeout", "the upstream did not answer in time", "timeout");
  if (err instanceof errors.BodyTimeoutError)
    return attemptFailure("upstream_timeout", "the upstream did not answer in time", "idle_timeout");
  if (!answered && connectionNotOpened(err))
    return attemptFailure("upstream_error", "the upstream could not be reached", "connect_error");
  // The request went out, then the connection broke: the request itself may be what broke it.
  return attemptFailure(
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
