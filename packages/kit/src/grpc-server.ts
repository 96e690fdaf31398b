// The gRPC server every service answers on (docs/architecture.md, "Calls between services"):
// gRPC's wire protocol (grpc-wire.ts) served by Node's own `http2`, as the client channel
// (channel.ts) speaks it. It replaced grpc-js's server, whose per-call machinery cost about
// twice the CPU of a bare `http2` answer (docs/performance.md, "Our own gRPC server"). A unary
// answer's trailers still leave in a write of their own: Node's `http2` ends a stream only once
// its last message has reached the socket, whoever drives it.
//
// - **Calls.** POST `/package.Service/Method` with `content-type: application/grpc`, one
//   request message (uncompressed, at most MAX_MESSAGE_BYTES), then the method's handler. An
//   unknown method is UNIMPLEMENTED; a malformed call is answered with a status, never a crash.
// - **Deadlines.** `grpc-timeout` is enforced: when it passes, the handler is told (as for a
//   cancel) and the caller gets DEADLINE_EXCEEDED.
// - **Cancels.** A caller that resets its stream or drops its connection cancels the call.
// - **Connections.** A ping every 30 s (10 s to answer) closes a connection that died silently.
//   Each connection is told to go (GOAWAY) after five minutes, its calls finishing first:
//   clients look a name up again only when a connection ends, so a scale-up gets calls.
// - **Shutdown.** Stop listening, GOAWAY every connection, let calls finish for the grace
//   period. Then each call still open is ended with UNAVAILABLE ("the server is stopping"), its
//   status written as a finished call's is, and its handler told as for a cancel: the caller
//   reads why its call ended, never a dropped connection. A connection that has still not
//   closed STOP_CLOSE_MS later (a caller that reads nothing) is destroyed.
import * as http2 from "node:http2";
import type { PeerCertificate, TLSSocket } from "node:tls";
import { status } from "@grpc/grpc-js";
import { encodeGrpcMessage, FrameReader, frame, parseGrpcTimeout } from "./grpc-wire.js";
import { RemoteError } from "./remote-error.js";

const PING_MS = 30_000;
const PING_TIMEOUT_MS = 10_000;
/** The longest delay a Node timer takes. */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** How long a connection serves new calls before it is asked to go. */
export const MAX_CONNECTION_AGE_MS = 5 * 60_000;
/**
 * How long, once the grace is over and the calls left were ended with a status, the connections
 * get to deliver those statuses and close before they are destroyed.
 */
export const STOP_CLOSE_MS = 1_000;
/** How a call still open when the shutdown's grace ends is ended. */
const STOPPING: CallStatus = { code: status.UNAVAILABLE, details: "the server is stopping" };

/** A call's end: its gRPC status, message and trailing metadata (lower-case text keys). */
export interface CallStatus {
  code: status;
  details: string;
  metadata?: Readonly<Record<string, string>>;
}

/** Request metadata read as grpc-js's Metadata is: a list per key, `-bin` values as bytes. */
export class IncomingMetadata {
  constructor(private readonly headers: http2.IncomingHttpHeaders) {}

  get(key: string): Array<string | Buffer> {
    const value = this.headers[key];
    if (value === undefined || key.startsWith(":")) return [];
    const list = Array.isArray(value) ? value : [value];
    return key.endsWith("-bin") ? list.map((v) => Buffer.from(v, "base64")) : list;
  }

  set(key: string, value: string): void {
    this.headers[key] = value;
  }
}

/** One incoming call, as a method's handler sees it. */
export interface ServerCall {
  readonly path: string;
  readonly metadata: IncomingMetadata;
  /** The request message's bytes. */
  readonly request: Buffer;
  /** True once the caller went away or the deadline passed. */
  readonly cancelled: boolean;
  /** The connection the call came on: the same object for each of its calls. */
  readonly connection: object | undefined;
  /** The caller's certificate, on a mutual TLS connection. */
  getAuthContext(): { sslPeerCertificate?: PeerCertificate } | null;
  /** Runs `listener` once when the call is cancelled (at once if it already is). */
  onCancel(listener: () => void): void;
  /** Answers a unary call: the message and an OK status, in one write. */
  answer(message: Uint8Array): void;
  /** Sends one message of a stream; false when the stream is full (wait with `drained`). */
  write(message: Uint8Array): boolean;
  /** Resolves when a full stream can take more, or the call is cancelled. */
  drained(): Promise<void>;
  /** Ends the call with `end` (OK when absent). Later calls do nothing. */
  end(end?: CallStatus): void;
}

/** What a method does with a call whose request has arrived. */
export type MethodHandler = (call: ServerCall) => void;

const OK: CallStatus = { code: status.OK, details: "" };

/** The headers or trailers that tell `end`. */
function statusHeaders(end: CallStatus): http2.OutgoingHttpHeaders {
  const out: http2.OutgoingHttpHeaders = { "grpc-status": String(end.code) };
  if (end.details !== "") out["grpc-message"] = encodeGrpcMessage(end.details);
  if (end.metadata) for (const [k, v] of Object.entries(end.metadata)) out[k] = v;
  return out;
}

/** `headers` without their metadata, for when a metadata value is one a header cannot carry. */
function statusOnly(headers: http2.OutgoingHttpHeaders): http2.OutgoingHttpHeaders {
  const out: http2.OutgoingHttpHeaders = { "grpc-status": headers["grpc-status"] };
  if (headers["grpc-message"] !== undefined) out["grpc-message"] = headers["grpc-message"];
  return out;
}

const OK_TRAILERS: http2.OutgoingHttpHeaders = { "grpc-status": "0" };
const RESPONSE_HEADERS: http2.OutgoingHttpHeaders = { ":status": 200, "content-type": "application/grpc" };

type AuthContext = { sslPeerCertificate?: PeerCertificate };
/** Each connection's TLS peer, read on its first call. */
const authContexts = new WeakMap<http2.Http2Session, AuthContext>();

class Call implements ServerCall {
  readonly metadata: IncomingMetadata;
  request: Buffer = EMPTY;
  cancelled = false;
  #responded = false;
  #ended = false;
  #trailers: http2.OutgoingHttpHeaders | undefined;
  #cancelListeners: (() => void) | Array<() => void> | undefined;
  #deadline: NodeJS.Timeout | undefined;
  #drainWaiter: (() => void) | undefined;

  constructor(
    readonly path: string,
    private readonly stream: http2.ServerHttp2Stream,
    headers: http2.IncomingHttpHeaders,
    /** The server's open calls: this one is in it until its stream closes. */
    open: Set<Call>,
  ) {
    open.add(this);
    this.metadata = new IncomingMetadata(headers);
    stream.on("wantTrailers", () => {
      const trailers = this.#trailers ?? OK_TRAILERS;
      try {
        stream.sendTrailers(trailers);
      } catch {
        stream.sendTrailers(statusOnly(trailers));
      }
    });
    stream.on("close", () => {
      open.delete(this);
      if (this.#deadline) clearTimeout(this.#deadline);
      if (!this.#ended) this.#cancel();
    });
  }

  /** Enforces a `grpc-timeout`. */
  expireIn(ms: number): void {
    this.#deadline = setTimeout(() => {
      this.end({ code: status.DEADLINE_EXCEEDED, details: "Deadline exceeded" });
      this.#cancel();
    }, ms);
  }

  /** Ends the call with `end` for the server's own reasons, and tells the handler as for a cancel. */
  stop(end: CallStatus): void {
    this.end(end);
    this.#cancel();
  }

  get connection(): object | undefined {
    return this.stream.session;
  }

  getAuthContext(): AuthContext | null {
    const session = this.stream.session;
    if (!session) return null;
    let context = authContexts.get(session);
    if (context === undefined) {
      // Read once per connection: the peer's certificate cannot change within it.
      const socket = session.socket as TLSSocket;
      const cert = typeof socket.getPeerCertificate === "function" ? socket.getPeerCertificate() : undefined;
      context = cert && Object.keys(cert).length > 0 ? { sslPeerCertificate: cert } : {};
      authContexts.set(session, context);
    }
    return context;
  }

  onCancel(listener: () => void): void {
    if (this.cancelled) {
      listener();
      return;
    }
    if (this.#cancelListeners === undefined) this.#cancelListeners = listener;
    else if (typeof this.#cancelListeners === "function")
      this.#cancelListeners = [this.#cancelListeners, listener];
    else this.#cancelListeners.push(listener);
  }

  #cancel(): void {
    if (this.cancelled) return;
    this.cancelled = true;
    this.#drainedOrCancelled();
    const listeners = this.#cancelListeners;
    this.#cancelListeners = undefined;
    if (typeof listeners === "function") listeners();
    else if (listeners) for (const l of listeners) l();
  }

  #respond(): boolean {
    if (this.#responded) return true;
    if (this.stream.destroyed || this.stream.closed) return false;
    this.#responded = true;
    this.stream.respond(RESPONSE_HEADERS, { waitForTrailers: true });
    return true;
  }

  answer(message: Uint8Array): void {
    if (this.#ended || !this.#respond()) return;
    this.#ended = true;
    if (this.#deadline) clearTimeout(this.#deadline);
    this.stream.end(frame(message));
  }

  write(message: Uint8Array): boolean {
    if (this.#ended || !this.#respond()) return true;
    return this.stream.write(frame(message));
  }

  drained(): Promise<void> {
    if (this.cancelled) return Promise.resolve();
    return new Promise((resolve) => {
      this.#drainWaiter = resolve;
      this.stream.once("drain", this.#drainedOrCancelled);
    });
  }

  /** Wakes a handler waiting in `drained` (one waiter at most: nothing piles up per wait). */
  readonly #drainedOrCancelled = () => {
    const waiter = this.#drainWaiter;
    if (!waiter) return;
    this.#drainWaiter = undefined;
    this.stream.off("drain", this.#drainedOrCancelled);
    waiter();
  };

  end(end: CallStatus = OK): void {
    if (this.#ended) return;
    this.#ended = true;
    if (this.#deadline) clearTimeout(this.#deadline);
    const stream = this.stream;
    if (stream.destroyed || stream.closed) return;
    const headers = statusHeaders(end);
    if (this.#responded) {
      this.#trailers = headers;
      stream.end();
      return;
    }
    this.#responded = true;
    try {
      // Trailers-Only: the status travels with the response headers.
      stream.respond({ ...RESPONSE_HEADERS, ...headers }, { endStream: true });
    } catch {
      stream.respond({ ...RESPONSE_HEADERS, ...statusOnly(headers) }, { endStream: true });
    }
  }
}

const EMPTY = Buffer.alloc(0);

/** How the server listens: plaintext, or mutual TLS with these settings. */
export interface GrpcServerOptions {
  tls?: http2.SecureServerOptions | undefined;
}

/** A gRPC server on Node's `http2`: register methods by path, listen, shut down. */
export class GrpcHttp2Server {
  readonly #methods = new Map<string, MethodHandler>();
  readonly #sessions = new Set<http2.ServerHttp2Session>();
  readonly #calls = new Set<Call>();
  /** Told when the last connection has closed. */
  #idle: Array<() => void> = [];
  readonly #server: http2.Http2Server | http2.Http2SecureServer;
  #draining = false;

  constructor(opts: GrpcServerOptions = {}) {
    const settings: http2.ServerOptions = {
      // Node's default cap of 10 MB per connection refuses calls (ENHANCE_YOUR_CALM) once that
      // much is buffered; flow control bounds what is buffered, as in the client (channel.ts).
      maxSessionMemory: Number.MAX_SAFE_INTEGER,
      maxSendHeaderBlockLength: Number.MAX_SAFE_INTEGER,
    };
    this.#server = opts.tls
      ? http2.createSecureServer({ ...opts.tls, ...settings, allowHTTP1: false, ALPNProtocols: ["h2"] })
      : http2.createServer(settings);
    this.#server.on("session", (session: http2.ServerHttp2Session) => this.#session(session));
    this.#server.on("stream", (stream, headers) => this.#stream(stream, headers));
    // A client that fails the TLS handshake is the client's problem; nothing to do here.
    this.#server.on("tlsClientError", () => {});
  }

  /** Serves `path` (`/package.Service/Method`) with `handler`. */
  register(path: string, handler: MethodHandler): void {
    if (this.#methods.has(path)) throw new Error(`${path} is served twice`);
    this.#methods.set(path, handler);
  }

  /** Binds host:port (port 0 picks a free one) and resolves to the bound port. */
  listen(host: string, port: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const server = this.#server;
      const failed = (err: Error) => reject(err);
      server.once("error", failed);
      server.listen(port, host, () => {
        server.off("error", failed);
        // After the bind, an error (a failed accept: too many open files) must not end the
        // process; the connections already open go on.
        server.on("error", () => {});
        const address = server.address();
        resolve(typeof address === "object" && address ? address.port : port);
      });
    });
  }

  /**
   * Stops accepting, asks every connection to go and lets calls finish for `graceMs`; then ends
   * each call left with UNAVAILABLE (its handler told as for a cancel) and destroys the
   * connections that have not closed STOP_CLOSE_MS later.
   */
  async shutdown(graceMs: number): Promise<void> {
    this.#draining = true;
    this.#server.close();
    for (const session of this.#sessions) session.close();
    if (await this.#closedWithin(graceMs)) return;
    for (const call of [...this.#calls]) call.stop(STOPPING);
    if (!(await this.#closedWithin(STOP_CLOSE_MS))) this.forceShutdown();
  }

  /** Resolves true once every connection has closed, false when `ms` pass first. */
  #closedWithin(ms: number): Promise<boolean> {
    if (this.#sessions.size === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const idle = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.#idle = this.#idle.filter((w) => w !== idle);
        resolve(false);
      }, ms);
      this.#idle.push(idle);
    });
  }

  /**
   * Destroys every connection at once, as a crash would: their calls are cancelled and their
   * callers see the connection drop, without a status.
   */
  forceShutdown(): void {
    this.#draining = true;
    this.#server.close();
    for (const session of this.#sessions) session.destroy();
  }

  #session(session: http2.ServerHttp2Session): void {
    this.#sessions.add(session);
    if (this.#draining) session.close();
    let pingTimer: NodeJS.Timeout | undefined;
    const ping = setInterval(() => {
      if (pingTimer || session.closed || session.destroyed) return;
      pingTimer = setTimeout(() => session.destroy(), PING_TIMEOUT_MS).unref();
      try {
        session.ping(() => {
          clearTimeout(pingTimer);
          pingTimer = undefined;
        });
      } catch {
        // The session is closing: its close event cleans up.
      }
    }, PING_MS).unref();
    const age = setTimeout(() => session.close(), MAX_CONNECTION_AGE_MS).unref();
    session.on("error", () => {});
    session.on("close", () => {
      clearInterval(ping);
      clearTimeout(age);
      if (pingTimer) clearTimeout(pingTimer);
      this.#sessions.delete(session);
      if (this.#sessions.size === 0 && this.#idle.length > 0) {
        const idle = this.#idle;
        this.#idle = [];
        // After the close's other listeners (a stream's own close) have run.
        setImmediate(() => {
          for (const w of idle) w();
        });
      }
    });
  }

  #stream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on("error", () => {});
    const path = headers[":path"] ?? "";
    const contentType = headers["content-type"];
    if (
      headers[":method"] !== "POST" ||
      typeof contentType !== "string" ||
      !contentType.startsWith("application/grpc")
    ) {
      stream.respond({ ":status": headers[":method"] !== "POST" ? 405 : 415 }, { endStream: true });
      return;
    }
    const call = new Call(path, stream, headers, this.#calls);
    const handler = this.#methods.get(path);
    if (!handler) {
      call.end({ code: status.UNIMPLEMENTED, details: `The server does not implement the method ${path}` });
      return;
    }
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") {
      call.end({ code: status.UNIMPLEMENTED, details: `message encoding "${encoding}" is not supported` });
      return;
    }
    const timeout = parseGrpcTimeout(headers["grpc-timeout"] as string | undefined);
    // Beyond a timer's range (about 24.8 days) Node would fire at once: such a deadline is none.
    if (timeout !== undefined && timeout <= MAX_TIMER_MS) call.expireIn(timeout);
    const reader = new FrameReader();
    let request: Buffer | undefined;
    let failed = false;
    stream.on("data", (chunk: Buffer) => {
      if (failed) return;
      try {
        for (const message of reader.push(chunk)) {
          if (request !== undefined)
            throw new RemoteError(status.INTERNAL, undefined, "more than one request message");
          request = message;
        }
      } catch (err) {
        failed = true;
        const e = err as RemoteError;
        call.end({ code: e.status, details: e.message });
        stream.close(http2.constants.NGHTTP2_NO_ERROR);
      }
    });
    stream.on("end", () => {
      if (failed || call.cancelled) return;
      if (request === undefined || reader.pendingBytes > 0) {
        call.end({ code: status.INTERNAL, details: "no whole request message" });
        return;
      }
      call.request = request;
      handler(call);
    });
  }
}
