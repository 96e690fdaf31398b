// The gRPC client channel every service calls its peers through (docs/architecture.md, "Calls
// between services"): gRPC's wire protocol (HTTP/2, length-prefixed messages, the status in
// trailers) spoken over Node's own `http2`, one connection per replica of the target.
//
// It replaced grpc-js's client, whose per-call machinery (resolver and picker layers, filter
// stacks, call objects, several turns of the event loop) cost 359 µs of CPU per call one at a
// time on the bench machine, against 105–136 µs for this one talking to the same grpc-js
// server (`bench/transport-floor.ts`; docs/performance.md, "Our own gRPC client"). The servers
// are the gateway's own as well (grpc-server.ts); the wire format is in grpc-wire.ts. What the
// channel does:
//
// - **Replicas.** A comma list of host:port is that many replicas; one name (or `dns:///name`)
//   is looked up with every address it has (a Kubernetes headless service), again whenever a
//   connection ends and at most every RESOLVE_MS while calls are made, so a scale-up is found.
// - **Balancing.** Each call goes to a ready replica by `choose` (least-request.ts): the fewest
//   calls in flight from this channel, among equals the preferred one, which moves every 5 s.
// - **Connections.** Every replica is kept connected; one that cannot be reached is retried
//   with a growing, jittered backoff (1 s to 30 s), but at once when a call or a readiness check
//   finds no replica ready and its last attempt is a second old (the call waits 250 ms at most
//   for it), so the first calls after a long outage bring the connection back instead of the
//   backoff grown meanwhile. A GOAWAY (the server's connection age, or its drain) moves new
//   calls to a fresh connection while the old one finishes its streams.
//   A ping every 30 s (10 s to answer) finds a connection that died silently.
// - **Calls.** A deadline travels as `grpc-timeout` and is enforced here too; an abort cancels
//   the stream (RST_STREAM CANCEL). A call the server refused before reading it (REFUSED_STREAM,
//   a stream above a GOAWAY's last id) is made once more on another connection.
// - **Failures** arrive as RemoteError: the status and message from the trailers, the domain
//   code and details from `tollgate-*` trailers; a lost connection is UNAVAILABLE.
import { lookup } from "node:dns/promises";
import * as http2 from "node:http2";
import { isIP } from "node:net";
import type { ConnectionOptions } from "node:tls";
import { status } from "@grpc/grpc-js";
import { FrameReader, frame, grpcTimeout } from "./grpc-wire.js";
import { choose, type Load } from "./least-request.js";
import { RemoteError, remoteErrorOf } from "./remote-error.js";

export { MAX_MESSAGE_BYTES } from "./grpc-wire.js";

/** How often a name's addresses may be looked up again. */
export const RESOLVE_MS = 30_000;
const PING_MS = 30_000;
const PING_TIMEOUT_MS = 10_000;
const BACKOFF_FIRST_MS = 1_000;
const BACKOFF_MAX_MS = 30_000;
/**
 * The least time between two attempts to reach one replica that a call or a readiness check
 * makes sooner than its backoff (#hurry).
 */
const HURRY_MS = 1_000;
/** How long a call that started such attempts waits for one to connect before it fails. */
const HURRY_WAIT_MS = 250;

const {
  NGHTTP2_CANCEL,
  NGHTTP2_REFUSED_STREAM,
  NGHTTP2_ENHANCE_YOUR_CALM,
  NGHTTP2_INADEQUATE_SECURITY,
  HTTP2_HEADER_STATUS,
} = http2.constants;

/** Why `request` throws when the picked connection went away before the call was sent. */
const CONNECTION_GONE: ReadonlySet<string> = new Set([
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
  "ERR_HTTP2_OUT_OF_STREAMS",
]);

/** Where a channel's replicas come from: fixed addresses, or a name looked up again and again. */
export type ChannelTarget =
  | { kind: "static"; addresses: readonly string[] }
  | { kind: "dns"; host: string; port: string };

/**
 * Reads a client address: "host:port", a comma list of them (the local stack's router replicas),
 * or "dns:///name:port" (a Kubernetes headless service). A single address whose host is not an IP
 * is looked up for every address it has.
 */
export function parseTarget(address: string): ChannelTarget {
  const parts = address
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  if (parts.length > 1) return { kind: "static", addresses: parts };
  const one = (parts[0] ?? address).replace(/^dns:(\/\/[^/]*)?\/?/, "");
  const { host, port } = splitHostPort(one);
  if (isIP(host) !== 0) return { kind: "static", addresses: [one] };
  return { kind: "dns", host, port };
}

function splitHostPort(address: string): { host: string; port: string } {
  const bracketed = /^\[([^\]]+)\]:(\d+)$/.exec(address);
  if (bracketed) return { host: bracketed[1]!, port: bracketed[2]! };
  const at = address.lastIndexOf(":");
  if (at <= 0) throw new Error(`"${address}" is not host:port`);
  return { host: address.slice(0, at), port: address.slice(at + 1) };
}

function joinHostPort(host: string, port: string): string {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

/** One replica of the target: its connection, and this channel's calls on it (its Load). */
interface Replica extends Load {
  address: string;
  session: http2.ClientHttp2Session | undefined;
  ready: boolean;
  backoffMs: number;
  retry: NodeJS.Timeout | undefined;
  /** When its last connection attempt began (ms since the epoch). */
  attemptAt: number;
  removed: boolean;
}

/** A call's request: method path, metadata, and when to give up. */
export interface CallHead {
  /** `/package.Service/Method`. */
  path: string;
  /** Request metadata (lower-case keys, text values). */
  metadata: Record<string, string>;
  /** Absolute deadline, ms since the epoch. */
  deadline?: number;
  signal?: AbortSignal;
}

/** A started call: its messages arrive through `onMessage`, its end through `onEnd`. */
interface CallSink {
  onMessage(message: Buffer): void;
  /** Once: undefined when the call ended OK, else the failure. */
  onEnd(err: RemoteError | undefined): void;
}

/** The gRPC status for an HTTP status that came without one (gRPC's HTTP-to-gRPC mapping). */
function statusOfHttp(code: number): status {
  switch (code) {
    case 400:
      return status.INTERNAL;
    case 401:
      return status.UNAUTHENTICATED;
    case 403:
      return status.PERMISSION_DENIED;
    case 404:
      return status.UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
      return status.UNAVAILABLE;
    default:
      return status.UNKNOWN;
  }
}

function headerText(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** The failure a status-bearing header block tells (undefined: OK). */
function failureOf(headers: http2.IncomingHttpHeaders): RemoteError | undefined {
  const code = Number(headerText(headers["grpc-status"]));
  if (code === status.OK) return undefined;
  let message = headerText(headers["grpc-message"]) ?? "";
  try {
    message = decodeURIComponent(message);
  } catch {
    // Not percent-encoded after all: kept as sent.
  }
  return remoteErrorOf(Number.isInteger(code) ? code : status.UNKNOWN, message, headers);
}

/** Why a stream ended without a status, from its RST_STREAM code. */
function failureOfReset(rstCode: number, address: string): RemoteError {
  switch (rstCode) {
    case NGHTTP2_CANCEL:
      return new RemoteError(status.CANCELLED, undefined, "call cancelled by the server");
    case NGHTTP2_REFUSED_STREAM:
      return new RemoteError(status.UNAVAILABLE, undefined, `stream refused by ${address}`);
    case NGHTTP2_ENHANCE_YOUR_CALM:
      return new RemoteError(status.RESOURCE_EXHAUSTED, undefined, "bandwidth or memory limit exceeded");
    case NGHTTP2_INADEQUATE_SECURITY:
      return new RemoteError(status.PERMISSION_DENIED, undefined, "protocol not secure enough");
    default:
      return new RemoteError(
        status.INTERNAL,
        undefined,
        `stream from ${address} ended without a status (code ${rstCode})`,
      );
  }
}

/** A copy of `list` in random order (Fisher–Yates): clients prefer different replicas. */
function shuffled<T>(list: readonly T[]): T[] {
  const out = [...list];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** How a channel connects, and how it finds a name's addresses. */
export interface ChannelOptions {
  /** Mutual TLS settings (this process's certificate and the CA); absent: plaintext. */
  tls?: ConnectionOptions | undefined;
  /** Every address of a name (default: the system resolver's, IPv4 and IPv6). */
  lookup?: (host: string) => Promise<string[]>;
  /** How often a name may be looked up again while calls are made (default RESOLVE_MS). */
  resolveMs?: number;
  /** The first pause before an unreachable replica is tried again (default BACKOFF_FIRST_MS). */
  backoffFirstMs?: number;
}

const systemLookup = async (host: string) => (await lookup(host, { all: true })).map((a) => a.address);

/** gRPC calls to one target's replicas. */
export class Channel {
  readonly #target: ChannelTarget;
  readonly #tls: ConnectionOptions | undefined;
  readonly #lookup: (host: string) => Promise<string[]>;
  readonly #resolveMs: number;
  readonly #backoffFirstMs: number;
  #replicas: Replica[] = [];
  /** Woken on every change of a replica's state (calls waiting for a ready one, $ready). */
  #waiters = new Set<() => void>();
  #started = false;
  #closed = false;
  #resolving: Promise<void> | undefined;
  #resolvedAt = 0;
  #resolveError = "";
  #lastError = "";
  #active = 0;
  #ping: NodeJS.Timeout | undefined;

  constructor(target: string | ChannelTarget, opts: ChannelOptions = {}) {
    this.#target = typeof target === "string" ? parseTarget(target) : target;
    this.#tls = opts.tls;
    this.#lookup = opts.lookup ?? systemLookup;
    this.#resolveMs = opts.resolveMs ?? RESOLVE_MS;
    this.#backoffFirstMs = opts.backoffFirstMs ?? BACKOFF_FIRST_MS;
  }

  /** Resolves once a replica is connected; rejects after `timeoutMs`. */
  async ready(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.#readyReplicas().length === 0) {
      if (this.#closed) throw new Error("channel closed");
      if (Date.now() >= deadline) throw new Error(`no replica of the target is ready: ${this.#why()}`);
      this.#start();
      this.#hurry();
      await this.#changed(Math.min(deadline, Date.now() + HURRY_MS));
    }
  }

  /** Stops: no new call; calls in flight finish on their connections, which then close. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#ping);
    for (const r of this.#replicas) this.#drop(r);
    this.#replicas = [];
    this.#wake();
  }

  /** A unary call: the one answer message, or a RemoteError. */
  unary(head: CallHead, request: Uint8Array): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      let answer: Buffer | undefined;
      let extra = false;
      this.#call(head, request, {
        onMessage(message) {
          if (answer === undefined) answer = message;
          else extra = true;
        },
        onEnd(err) {
          if (err) reject(err);
          else if (answer === undefined || extra)
            reject(new RemoteError(status.UNIMPLEMENTED, undefined, "a unary call must answer one message"));
          else resolve(answer);
        },
      });
    });
  }

  /** A server-streaming call: its messages as they arrive; a failure is thrown after them. */
  async *serverStream(head: CallHead, request: Uint8Array): AsyncGenerator<Buffer> {
    const queue: Buffer[] = [];
    let ended = false;
    let failure: RemoteError | undefined;
    let wake: (() => void) | undefined;
    const stop = new AbortController();
    const onAbort = () => stop.abort();
    head.signal?.addEventListener("abort", onAbort, { once: true });
    if (head.signal?.aborted) stop.abort();
    // Backpressure: past HIGH messages waiting, the rest stays in HTTP/2's flow control.
    const HIGH = 16;
    const control = this.#call({ ...head, signal: stop.signal }, request, {
      onMessage(message) {
        queue.push(message);
        if (queue.length === HIGH) control.pause();
        wake?.();
      },
      onEnd(err) {
        ended = true;
        failure = err;
        wake?.();
      },
    });
    try {
      for (;;) {
        const message = queue.shift();
        if (message !== undefined) {
          if (queue.length === HIGH / 2) control.resume();
          yield message;
          continue;
        }
        if (ended) {
          if (failure) throw failure;
          return;
        }
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
        wake = undefined;
      }
    } finally {
      head.signal?.removeEventListener("abort", onAbort);
      // A consumer that stops early cancels the call.
      if (!ended) stop.abort();
    }
  }

  /** Starts a call (picking a replica first), reporting to `sink`; pause/resume its messages. */
  #call(head: CallHead, request: Uint8Array, sink: CallSink): { pause(): void; resume(): void } {
    let stream: http2.ClientHttp2Stream | undefined;
    let paused = false;
    let done = false;
    const end = (err: RemoteError | undefined) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      head.signal?.removeEventListener("abort", onAbort);
      sink.onEnd(err);
    };
    let cancelled: RemoteError | undefined;
    const cancel = (err: RemoteError) => {
      cancelled ??= err;
      if (stream && !stream.closed) stream.close(NGHTTP2_CANCEL);
      else end(err);
    };
    const onAbort = () => cancel(new RemoteError(status.CANCELLED, undefined, "call cancelled"));
    let timer: NodeJS.Timeout | undefined;
    if (head.signal?.aborted) {
      end(new RemoteError(status.CANCELLED, undefined, "call cancelled"));
      return { pause() {}, resume() {} };
    }
    head.signal?.addEventListener("abort", onAbort, { once: true });
    if (head.deadline !== undefined) {
      const left = head.deadline - Date.now();
      const expire = () => cancel(new RemoteError(status.DEADLINE_EXCEEDED, undefined, "deadline exceeded"));
      if (left <= 0) {
        expire();
        return { pause() {}, resume() {} };
      }
      timer = setTimeout(expire, left);
    }
    const body = frame(request);
    // Whether this call started connection attempts sooner than their backoff (#hurry).
    let hurried = false;
    const attempt = (retried: boolean) => {
      const replica = this.#pick();
      if (!replica) {
        if (this.#closed) return end(new RemoteError(status.UNAVAILABLE, undefined, "channel closed"));
        const unreachable = () =>
          end(new RemoteError(status.UNAVAILABLE, undefined, `no replica is reachable: ${this.#why()}`));
        // A call that started attempts waits HURRY_WAIT_MS at most for them: a replica that is
        // back serves it; one still away (or slow to answer a connect) fails it fast, as before.
        if (hurried) return unreachable();
        if (!this.#connecting()) {
          if (!this.#hurry()) return unreachable();
          hurried = true;
          const until = Math.min(head.deadline ?? Number.POSITIVE_INFINITY, Date.now() + HURRY_WAIT_MS);
          this.#changed(until).then(() => {
            if (!done && !cancelled) attempt(retried);
          });
          return;
        }
        // Replicas are connecting: the call waits for one (or its deadline, or its abort).
        this.#changed(head.deadline).then(() => {
          if (!done && !cancelled) attempt(retried);
        });
        return;
      }
      const session = replica.session!;
      const headers: http2.OutgoingHttpHeaders = {
        ":method": "POST",
        ":path": head.path,
        "content-type": "application/grpc",
        te: "trailers",
        ...head.metadata,
      };
      if (head.deadline !== undefined) headers["grpc-timeout"] = grpcTimeout(head.deadline - Date.now());
      let s: http2.ClientHttp2Stream;
      try {
        s = session.request(headers, { endStream: false });
      } catch (err) {
        if (CONNECTION_GONE.has((err as NodeJS.ErrnoException).code ?? "")) {
          // The connection closed between the pick and the call: nothing was sent.
          replica.ready = false;
          return attempt(retried);
        }
        // Not the connection: the request itself (metadata HTTP/2 cannot carry). Node 20 also
        // closes the connection for it; the next call then waits for a new one.
        return end(new RemoteError(status.INTERNAL, undefined, `call not sent: ${(err as Error).message}`));
      }
      stream = s;
      replica.inFlight++;
      if (this.#active++ === 0) this.#ref(true);
      if (paused) s.pause();
      const reader = new FrameReader();
      let responded = false;
      let failure: RemoteError | undefined;
      let finished = false;
      s.on("response", (h) => {
        responded = true;
        const code = Number(h[HTTP2_HEADER_STATUS]);
        if (code !== 200) {
          failure ??= new RemoteError(
            statusOfHttp(code),
            undefined,
            `HTTP status ${code} from ${replica.address}`,
          );
        } else if (h["grpc-status"] !== undefined) {
          // Trailers-Only: the status came with the headers.
          finished = true;
          failure ??= failureOf(h);
        }
      });
      s.on("data", (chunk: Buffer) => {
        if (failure || cancelled) return;
        try {
          for (const message of reader.push(chunk)) sink.onMessage(message);
        } catch (err) {
          cancel(err as RemoteError);
        }
      });
      s.on("trailers", (t) => {
        finished = true;
        failure ??= failureOf(t);
      });
      let streamError: NodeJS.ErrnoException | undefined;
      s.on("error", (err: NodeJS.ErrnoException) => {
        streamError = err;
      });
      s.on("close", () => {
        replica.inFlight--;
        if (--this.#active === 0) this.#ref(false);
        let err: RemoteError | undefined = cancelled ?? failure;
        if (!cancelled && !finished && !failure) {
          // Refused before the server read it (REFUSED_STREAM, or above a GOAWAY's last stream):
          // safe to make once more, elsewhere.
          if (!responded && s.rstCode === NGHTTP2_REFUSED_STREAM && !retried) {
            stream = undefined;
            return attempt(true);
          }
          // The connection went (the server died or restarted), not just this stream.
          const connectionLost =
            session.destroyed || (streamError !== undefined && streamError.code !== "ERR_HTTP2_STREAM_ERROR");
          err = connectionLost
            ? new RemoteError(status.UNAVAILABLE, undefined, `connection to ${replica.address} dropped`)
            : failureOfReset(s.rstCode ?? 0, replica.address);
        }
        if (err?.status === status.UNAVAILABLE) replica.failedAt = Date.now();
        end(err);
      });
      s.end(body);
    };
    attempt(false);
    return {
      pause() {
        paused = true;
        stream?.pause();
      },
      resume() {
        paused = false;
        stream?.resume();
      },
    };
  }

  #readyReplicas(): Replica[] {
    return this.#replicas.filter((r) => r.ready && r.session !== undefined);
  }

  #pick(): Replica | undefined {
    this.#start();
    this.#maybeResolve();
    const ready = this.#readyReplicas();
    return ready.length === 0 ? undefined : choose(ready, Date.now());
  }

  /**
   * Connects now to every replica waiting out a backoff whose last attempt began HURRY_MS ago or
   * more: after a long outage the backoff has grown towards BACKOFF_MAX_MS, and the calls that
   * find no replica ready should not wait that long once it is back. An idle channel keeps its
   * backoff. Whether it started any.
   */
  #hurry(): boolean {
    const now = Date.now();
    let started = false;
    for (const r of this.#replicas) {
      if (r.retry === undefined || now - r.attemptAt < HURRY_MS) continue;
      clearTimeout(r.retry);
      r.retry = undefined;
      this.#connect(r);
      started = true;
    }
    return started;
  }

  /** Whether a ready replica may still come without waiting for a backoff. */
  #connecting(): boolean {
    return (
      this.#resolving !== undefined ||
      this.#replicas.some((r) => r.session !== undefined && !r.ready && r.retry === undefined)
    );
  }

  #why(): string {
    return this.#resolveError || this.#lastError || "not connected yet";
  }

  /** Resolves at the next state change (or at `deadline`). */
  #changed(deadline?: number): Promise<void> {
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const wake = () => {
        clearTimeout(timer);
        this.#waiters.delete(wake);
        resolve();
      };
      this.#waiters.add(wake);
      if (deadline !== undefined) timer = setTimeout(wake, Math.max(0, deadline - Date.now()));
    });
  }

  #wake(): void {
    const waiters = [...this.#waiters];
    this.#waiters.clear();
    for (const w of waiters) w();
  }

  #start(): void {
    if (this.#started || this.#closed) return;
    this.#started = true;
    this.#ping = setInterval(() => this.#pingAll(), PING_MS).unref();
    if (this.#target.kind === "static") this.#setAddresses(this.#target.addresses);
    else this.#resolve();
  }

  #maybeResolve(): void {
    if (this.#target.kind === "dns" && Date.now() - this.#resolvedAt >= this.#resolveMs) this.#resolve();
  }

  #resolve(): void {
    const target = this.#target;
    if (target.kind !== "dns" || this.#resolving || this.#closed) return;
    this.#resolvedAt = Date.now();
    this.#resolving = this.#lookup(target.host)
      .then(
        (found) => {
          this.#resolveError = "";
          if (found.length === 0) this.#resolveError = `no addresses for ${target.host}`;
          else this.#setAddresses(found.map((a) => joinHostPort(a, target.port)));
        },
        (err: Error) => {
          // The list already known stays: a failed lookup does not drop working replicas.
          this.#resolveError = `cannot resolve ${target.host}: ${err.message}`;
        },
      )
      .finally(() => {
        this.#resolving = undefined;
        this.#wake();
      });
  }

  /** Keeps replicas still listed (their calls in flight still count), adds and drops the rest. */
  #setAddresses(addresses: readonly string[]): void {
    if (this.#closed) return;
    const kept = new Map(this.#replicas.map((r) => [r.address, r]));
    const next: Replica[] = [];
    for (const address of new Set(addresses)) {
      const known = kept.get(address);
      kept.delete(address);
      next.push(
        known ?? {
          address,
          session: undefined,
          ready: false,
          inFlight: 0,
          failedAt: 0,
          backoffMs: 0,
          attemptAt: 0,
          retry: undefined,
          removed: false,
        },
      );
    }
    for (const gone of kept.values()) this.#drop(gone);
    // A new list is shuffled once; an unchanged one keeps its order (and so its preference).
    const same = next.length === this.#replicas.length && kept.size === 0;
    this.#replicas = same ? this.#replicas : shuffled(next);
    for (const r of this.#replicas) this.#connect(r);
    this.#wake();
  }

  #drop(r: Replica): void {
    r.removed = true;
    r.ready = false;
    clearTimeout(r.retry);
    r.retry = undefined;
    // Calls in flight finish; the connection closes after them.
    r.session?.close();
    r.session = undefined;
  }

  #connect(r: Replica): void {
    if (this.#closed || r.removed || r.session !== undefined || r.retry !== undefined) return;
    r.attemptAt = Date.now();
    const { host, port } = splitHostPort(r.address);
    const url = `${this.#tls ? "https" : "http"}://${joinHostPort(host, port)}`;
    const session = http2.connect(url, {
      ...(this.#tls ?? {}),
      settings: { enablePush: false },
      // Node's default cap of 10 MB per session refuses calls (ENHANCE_YOUR_CALM) once that much
      // is buffered: 24 calls of 1 MiB in flight trip it. Flow control bounds what is buffered;
      // grpc-js's client lifts the cap the same way.
      maxSessionMemory: Number.MAX_SAFE_INTEGER,
      maxSendHeaderBlockLength: Number.MAX_SAFE_INTEGER,
    });
    r.session = session;
    r.ready = false;
    if (this.#active === 0) session.unref();
    // Whether this connection ever worked (its replica's `ready` may be cleared before it ends).
    let connected = false;
    session.once("connect", () => {
      connected = true;
      if (r.session !== session) return;
      r.ready = true;
      r.backoffMs = 0;
      this.#wake();
    });
    session.on("error", (err: Error) => {
      this.#lastError = `${r.address}: ${err.message}`;
    });
    const lost = () => {
      if (r.session !== session) return;
      r.session = undefined;
      r.ready = false;
      if (!connected) r.failedAt = Date.now();
      if (this.#closed || r.removed) return this.#wake();
      this.#resolve();
      if (connected) {
        // A connection that worked and ended (the server's connection age, a restart): at once.
        this.#connect(r);
      } else {
        r.backoffMs = Math.min(BACKOFF_MAX_MS, r.backoffMs === 0 ? this.#backoffFirstMs : r.backoffMs * 1.6);
        const delay = r.backoffMs * (0.8 + 0.4 * Math.random());
        r.retry = setTimeout(() => {
          r.retry = undefined;
          this.#connect(r);
        }, delay).unref();
      }
      this.#wake();
    };
    // A GOAWAY takes no new calls: they go to a new connection while this one finishes its own.
    session.once("goaway", lost);
    session.once("close", lost);
  }

  /** Calls in flight keep the process alive; an idle channel does not. */
  #ref(on: boolean): void {
    for (const r of this.#replicas) {
      if (!r.session) continue;
      if (on) r.session.ref();
      else r.session.unref();
    }
  }

  #pingAll(): void {
    for (const r of this.#replicas) {
      const session = r.session;
      if (!session || !r.ready) continue;
      const timer = setTimeout(() => session.destroy(), PING_TIMEOUT_MS).unref();
      try {
        session.ping((err) => {
          clearTimeout(timer);
          if (err) session.destroy();
        });
      } catch {
        clearTimeout(timer);
      }
    }
  }
}
