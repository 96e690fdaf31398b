import type { SecureServerOptions } from "node:http2";
import type {
  DescMessage,
  DescMethod,
  DescService,
  MessageInitShape,
  MessageShape,
} from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import * as grpc from "@grpc/grpc-js";
import { decodeMessage, encodeMessage } from "@tollgate/proto/codec";
import type { Logger } from "pino";
import { type CallHead, Channel } from "./channel.js";
import { type AccessTable, authOff, decide, type InternalAuth } from "./credentials.js";
import { type CallStatus, GrpcHttp2Server, type ServerCall } from "./grpc-server.js";
import { Health, type HealthCheck } from "./health.js";
import { isRedisUnavailable } from "./redis.js";
import {
  ERROR_CODE_KEY,
  ERROR_DETAIL_PREFIX,
  type ErrorDetails,
  RemoteError,
  remoteErrorOf,
} from "./remote-error.js";
import {
  ATTR,
  type Attributes,
  extractMetadata,
  failSpan,
  injectMetadata,
  type MetadataLike,
  NOOP_SPAN,
  runInSpan,
  type Span,
  SpanKind,
  startSpan,
  tracingEnabled,
} from "./tracing.js";

export { status as GrpcStatus } from "@grpc/grpc-js";
export type { CallStatus } from "./grpc-server.js";
export { ERROR_CODE_KEY, ERROR_DETAIL_PREFIX, type ErrorDetails, RemoteError } from "./remote-error.js";

/** Detail names travel as metadata keys: lower-case ASCII, and not "-bin" (binary) ones. */
const DETAIL_NAME = /^[a-z0-9][a-z0-9_.-]*$/;

/**
 * A domain failure on its way out of a gRPC handler: a gRPC status plus the domain code.
 * Each service builds these in exactly one place, its transport/grpc/errors.ts. Optional
 * `details` travel as trailing metadata `tollgate-<name>` and arrive as `RemoteError.details`.
 */
export class StatusError extends Error {
  constructor(
    readonly status: grpc.status,
    readonly code: string,
    message: string,
    readonly details: ErrorDetails = {},
  ) {
    super(message);
    this.name = "StatusError";
    for (const name of Object.keys(details)) {
      if (!DETAIL_NAME.test(name) || name === "code" || name.endsWith("-bin")) {
        throw new TypeError(`invalid error detail name "${name}"`);
      }
    }
  }
}

/** Per-call context handed to handlers. */
export interface CallContext {
  /** Aborted when the caller cancels or the deadline passes. */
  signal: AbortSignal;
  metadata: MetadataLike;
}

type Unary<I extends DescMessage, O extends DescMessage> = {
  methodKind: "unary";
  input: I;
  output: O;
};
type ServerStreaming<I extends DescMessage, O extends DescMessage> = {
  methodKind: "server_streaming";
  input: I;
  output: O;
};

/** The handlers a service implements, typed from its generated descriptor. */
export type ServiceHandlers<M extends GenServiceMethods> = {
  [K in keyof M]: M[K] extends Unary<infer I, infer O>
    ? (req: MessageShape<I>, ctx: CallContext) => Promise<MessageInitShape<O>>
    : M[K] extends ServerStreaming<infer I, infer O>
      ? (req: MessageShape<I>, ctx: CallContext) => AsyncIterable<MessageInitShape<O>>
      : never;
};

/** The method map of a generated service descriptor. */
export type MethodsOf<S> = S extends GenService<infer M extends GenServiceMethods> ? M : never;

/** The handlers of a generated service, e.g. `Handlers<typeof AuthService>`. */
export type Handlers<S> = ServiceHandlers<MethodsOf<S>>;

/** A typed promise/stream client, derived from a generated descriptor. */
export type ServiceClient<M extends GenServiceMethods> = {
  [K in keyof M]: M[K] extends Unary<infer I, infer O>
    ? (req: MessageInitShape<I>, opts?: CallOptions) => Promise<MessageShape<O>>
    : M[K] extends ServerStreaming<infer I, infer O>
      ? (req: MessageInitShape<I>, opts?: CallOptions) => AsyncIterable<MessageShape<O>>
      : never;
};

/** Options for one client call. */
export interface CallOptions {
  signal?: AbortSignal;
  /** Milliseconds from now. */
  timeoutMs?: number;
}

function serializer(schema: DescMessage) {
  return (msg: unknown) => {
    const bytes = encodeMessage(schema, msg as MessageInitShape<DescMessage>);
    return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  };
}

/** One RPC's span name and attributes (OpenTelemetry RPC conventions), computed once per method. */
export interface RpcSpec {
  name: string;
  attributes: Attributes;
}

export function rpcSpec(service: DescService, m: DescMethod): RpcSpec {
  return {
    name: `${service.typeName}/${m.name}`,
    attributes: { [ATTR.rpcSystem]: "grpc", [ATTR.rpcService]: service.typeName, [ATTR.rpcMethod]: m.name },
  };
}

/** Statuses that mean the server failed (not the caller's request), per the RPC conventions. */
const SERVER_FAULTS: ReadonlySet<grpc.status> = new Set([
  grpc.status.UNKNOWN,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.UNIMPLEMENTED,
  grpc.status.INTERNAL,
  grpc.status.UNAVAILABLE,
  grpc.status.DATA_LOSS,
]);

/** Ends an RPC span with its status; `errorType` is the domain code when there was one. */
export function endRpcSpan(span: Span, kind: SpanKind, code: grpc.status, errorType?: string): void {
  if (span === NOOP_SPAN) return;
  span.setAttribute(ATTR.rpcGrpcStatus, code);
  const failed = kind === SpanKind.CLIENT ? code !== grpc.status.OK : SERVER_FAULTS.has(code);
  if (failed) failSpan(span, errorType ?? grpc.status[code] ?? String(code));
  else if (errorType !== undefined) span.setAttribute(ATTR.errorType, errorType);
  span.end();
}

/** The domain code of a failure a handler threw, for its span. */
function errorTypeOf(err: unknown): string {
  return err instanceof StatusError || err instanceof RemoteError ? (err.code ?? "internal") : "internal";
}

/** The domain code of an UNAVAILABLE answer sent because the service's Redis is unreachable. */
export const STORE_UNAVAILABLE = "store_unavailable";

/** Maps a thrown value to a call's status; unknown failures become INTERNAL without detail. */
export function toServiceError(err: unknown, log: Logger, method: string): CallStatus {
  if (err instanceof StatusError) {
    const metadata: Record<string, string> = { [ERROR_CODE_KEY]: err.code };
    for (const [name, value] of Object.entries(err.details)) metadata[ERROR_DETAIL_PREFIX + name] = value;
    return { code: err.status, details: err.message, metadata };
  }
  if (isRedisUnavailable(err)) {
    // Redis down or restarting: the caller may retry (HTTP 503), nothing is wrong with the call.
    log.warn({ err, method }, "store unavailable");
    return {
      code: grpc.status.UNAVAILABLE,
      details: "store unavailable",
      metadata: { [ERROR_CODE_KEY]: STORE_UNAVAILABLE },
    };
  }
  log.error({ err, method }, "handler failed");
  return {
    code: grpc.status.INTERNAL,
    details: "internal error",
    metadata: { [ERROR_CODE_KEY]: "internal" },
  };
}

/** The error a failed call's status gives its caller (what the client channel would read). */
export function toRemoteError(end: CallStatus): RemoteError {
  return remoteErrorOf(end.code, end.details, end.metadata ?? {});
}

/** A call's context plus whether its handler has answered. */
interface CallState {
  ctx: CallContext;
  /** Set once the handler has answered (or failed): a later cancel aborts nothing. */
  settled: boolean;
}

/**
 * The context of one call. Its AbortSignal is made on the first read of `ctx.signal`: most
 * handlers (auth-policy's) never read it, and an AbortController per call is measurable on
 * the request path. A signal made after the caller went away starts aborted.
 */
function contextOf(call: ServerCall): CallState {
  let controller: AbortController | undefined;
  const state: CallState = {
    ctx: {
      get signal() {
        if (!controller) {
          controller = new AbortController();
          if (call.cancelled) controller.abort();
        }
        return controller.signal;
      },
      metadata: call.metadata,
    },
    settled: false,
  };
  // A cancel after the handler answered aborts nothing: it would only make a DOMException
  // (its stack) per call.
  call.onCancel(() => {
    if (!state.settled) controller?.abort();
  });
  return state;
}

/** Who may call a service's methods, and how callers are identified. */
export interface CallerCheck {
  auth: InternalAuth;
  access: Readonly<Record<string, readonly string[]>>;
}

/**
 * The refusal of a call its caller may not make, or undefined when it may. Logged without any
 * credential: only the method and the identity (when one was proved).
 */
function refusal(
  check: CallerCheck | undefined,
  call: ServerCall,
  m: DescMethod,
  log: Logger,
): CallStatus | undefined {
  if (!check || check.auth.mode === "off") return undefined;
  const caller = check.auth.identify(call);
  const decision = decide(check.access as Record<string, readonly never[]>, m.localName, caller);
  if (decision === "allow") return undefined;
  log.warn({ method: m.name, caller: caller ?? null, decision }, "internal call refused");
  const metadata = { [ERROR_CODE_KEY]: decision };
  return decision === "unauthenticated"
    ? { code: grpc.status.UNAUTHENTICATED, details: "unauthenticated", metadata }
    : { code: grpc.status.PERMISSION_DENIED, details: `${caller} may not call ${m.name}`, metadata };
}

const UNREADABLE_REQUEST: CallStatus = {
  code: grpc.status.INTERNAL,
  details: "request message could not be read",
};

/**
 * Adapts promise/async-iterable handlers to the server's calls and registers them on `server`.
 * With `check`, each call is first checked against the service's access table.
 */
export function addService<M extends GenServiceMethods>(
  server: GrpcHttp2Server,
  service: GenService<M>,
  handlers: ServiceHandlers<M>,
  log: Logger,
  check?: CallerCheck,
): void {
  for (const m of service.methods as DescMethod[]) {
    const handler = (handlers as Record<string, unknown>)[m.localName] as (
      req: unknown,
      ctx: CallContext,
    ) => unknown;
    // A method without a handler is not served: callers get UNIMPLEMENTED.
    if (typeof handler !== "function") continue;
    const rpc = rpcSpec(service, m);
    const encode = serializer(m.output);
    // Tracing off: no span, no metadata lookup; the handler runs in the caller's context.
    const serverSpan = (call: ServerCall) =>
      tracingEnabled()
        ? startSpan(rpc.name, SpanKind.SERVER, rpc.attributes, extractMetadata(call.metadata))
        : NOOP_SPAN;
    /** The call's request, or undefined after answering that it could not be read. */
    const requestOf = (call: ServerCall): unknown => {
      try {
        return decodeMessage(m.input, call.request);
      } catch {
        call.end(UNREADABLE_REQUEST);
        return undefined;
      }
    };
    /** The status a handler's failure ends its call with, and the span's error type. */
    const failure = (call: ServerCall, err: unknown): [CallStatus, string] =>
      call.cancelled
        ? // A caller that went away is not a failure of this service: nothing to log.
          [{ code: grpc.status.CANCELLED, details: "cancelled by the caller" }, "cancelled"]
        : [toServiceError(err, log, m.name), errorTypeOf(err)];
    const path = `/${service.typeName}/${m.name}`;
    if (m.methodKind === "unary") {
      server.register(path, (call) => {
        const refused = refusal(check, call, m, log);
        if (refused) return call.end(refused);
        const req = requestOf(call);
        if (req === undefined) return;
        const state = contextOf(call);
        const span = serverSpan(call);
        runInSpan(span, () => handler(req, state.ctx) as Promise<unknown>)
          .then((res) => {
            state.settled = true;
            call.answer(encode(res));
            endRpcSpan(span, SpanKind.SERVER, grpc.status.OK);
          })
          .catch((err: unknown) => {
            state.settled = true;
            const [end, errorType] = failure(call, err);
            endRpcSpan(span, SpanKind.SERVER, end.code, errorType);
            call.end(end);
          });
      });
    } else if (m.methodKind === "server_streaming") {
      server.register(path, (call) => {
        const refused = refusal(check, call, m, log);
        if (refused) return call.end(refused);
        const req = requestOf(call);
        if (req === undefined) return;
        const state = contextOf(call);
        const span = serverSpan(call);
        void runInSpan(span, async () => {
          let code = grpc.status.OK;
          let errorType: string | undefined;
          try {
            for await (const msg of handler(req, state.ctx) as AsyncIterable<unknown>) {
              if (call.cancelled) return;
              // Waiting on "drain" alone would park a handler forever when a slow caller goes
              // away, and its cleanup (billing the tokens produced) would never run.
              if (!call.write(encode(msg))) await call.drained();
            }
            call.end();
          } catch (err) {
            const [end, type] = failure(call, err);
            errorType = type;
            code = end.code;
            call.end(end);
          } finally {
            state.settled = true;
            endRpcSpan(span, SpanKind.SERVER, call.cancelled ? grpc.status.CANCELLED : code, errorType);
          }
        });
      });
    } else {
      throw new Error(`streaming kind ${m.methodKind} is not supported by the bridge`);
    }
  }
}

/** Creates a gRPC server (grpc-server.ts); with `tls`, it takes mutual TLS connections only. */
export function createServer(tls?: SecureServerOptions): GrpcHttp2Server {
  return new GrpcHttp2Server({ tls });
}

/** Binds `server` to host:port (port 0 picks a free one) and resolves to the bound port. */
export function bindServer(server: GrpcHttp2Server, host: string, port: number): Promise<number> {
  return server.listen(host, port);
}

/** Stops accepting calls, lets in-flight calls finish for up to `graceMs`, then forces. */
export function shutdownServer(server: GrpcHttp2Server, graceMs = 10_000): Promise<void> {
  return server.shutdown(graceMs);
}

/**
 * A typed client plus its lifecycle. The lifecycle methods carry a `$` so that they can never
 * collide with an RPC's name (PaymentService has a Close RPC).
 */
export type Client<M extends GenServiceMethods> = ServiceClient<M> & {
  $close(): void;
  /** Resolves once a replica is connected, or rejects after `timeoutMs`. */
  $ready(timeoutMs: number): Promise<void>;
};

/** A call's request metadata as gRPC metadata for the credential and the trace context. */
class CallMetadata {
  readonly headers: Record<string, string> = {};
  get(key: string): string[] {
    const value = this.headers[key];
    return value === undefined ? [] : [value];
  }
  set(key: string, value: string): void {
    this.headers[key] = value;
  }
}

/**
 * Creates a typed promise/stream client for a generated service descriptor, calling through a
 * Channel (channel.ts: the replicas of `address`, balanced by least calls in flight). `auth` is
 * the calling process's internal authentication (its certificate or token); absent: none.
 */
export function createClient<M extends GenServiceMethods>(
  service: GenService<M>,
  address: string,
  auth: InternalAuth = authOff(),
): Client<M> {
  const channel = new Channel(address, { tls: auth.clientTls() });
  const client: Record<string, unknown> = {};
  for (const m of service.methods as DescMethod[]) {
    const path = `/${service.typeName}/${m.name}`;
    const encode = serializer(m.input);
    const rpc = rpcSpec(service, m);
    const start = (opts: CallOptions) => {
      const metadata = new CallMetadata();
      auth.addCallCredential(metadata);
      // Tracing off: no span and no trace metadata, exactly as without tracing.
      let span = NOOP_SPAN;
      if (tracingEnabled()) {
        span = startSpan(rpc.name, SpanKind.CLIENT, rpc.attributes);
        injectMetadata(metadata, span);
      }
      const head: CallHead = {
        path,
        metadata: metadata.headers,
        ...(opts.timeoutMs ? { deadline: Date.now() + opts.timeoutMs } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
      };
      return { head, span };
    };
    const failed = (span: Span, err: unknown): never => {
      const remote = err instanceof RemoteError ? err : undefined;
      endRpcSpan(span, SpanKind.CLIENT, remote?.status ?? grpc.status.UNKNOWN, remote?.code);
      throw err;
    };
    if (m.methodKind === "unary") {
      client[m.localName] = async (req: unknown, opts: CallOptions = {}) => {
        const { head, span } = start(opts);
        try {
          const answer = decodeMessage(m.output, await channel.unary(head, encode(req)));
          endRpcSpan(span, SpanKind.CLIENT, grpc.status.OK);
          return answer;
        } catch (err) {
          return failed(span, err);
        }
      };
    } else if (m.methodKind === "server_streaming") {
      client[m.localName] = (req: unknown, opts: CallOptions = {}) =>
        (async function* () {
          const { head, span } = start(opts);
          let ended = false;
          try {
            for await (const message of channel.serverStream(head, encode(req)))
              yield decodeMessage(m.output, message);
            ended = true;
            endRpcSpan(span, SpanKind.CLIENT, grpc.status.OK);
          } catch (err) {
            ended = true;
            failed(span, err);
          } finally {
            // The consumer stopped iterating before the stream ended: the call was cancelled.
            if (!ended) endRpcSpan(span, SpanKind.CLIENT, grpc.status.CANCELLED);
          }
        })();
    }
  }
  client.$close = () => channel.close();
  client.$ready = (timeoutMs: number) => channel.ready(timeoutMs);
  return client as Client<M>;
}

/** One service and its handlers, ready to be served; build it with `implement`. */
export interface Implementation {
  register(server: GrpcHttp2Server, log: Logger, auth: InternalAuth): string;
}

/**
 * Pairs a generated service with its handlers and its access table (who may call each method),
 * checked against each other: a method without handler or table entry does not compile.
 */
export function implement<M extends GenServiceMethods>(
  service: GenService<M>,
  handlers: ServiceHandlers<M>,
  access: AccessTable<M>,
): Implementation {
  return {
    register(server, log, auth) {
      addService(server, service, handlers, log, {
        auth,
        access: access as Record<string, readonly string[]>,
      });
      return service.typeName;
    },
  };
}

/** A bound gRPC server serving its services and grpc.health.v1. */
export interface GrpcServer {
  port: number;
  /** The plaintext health-only port, when one was asked for. */
  healthPort?: number;
  health: Health;
  /** Not ready → stop accepting → let in-flight calls (streams too) finish for up to `graceMs`. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * The one way a service serves gRPC: register the implementations and grpc.health.v1 (whose
 * status follows `checks`), bind, and mark serving.
 */
export async function serveGrpc(opts: {
  host: string;
  port: number;
  log: Logger;
  services: readonly Implementation[];
  checks?: readonly HealthCheck[];
  /**
   * How callers authenticate (every service's main.ts builds it with loadInternalAuth, which
   * refuses to run open unless told). Absent: no authentication, for tests that start a
   * service in process. grpc.health.v1 is never checked.
   */
  auth?: InternalAuth;
  /**
   * A second, plaintext port serving only grpc.health.v1, for probes that cannot present a
   * client certificate (kubelet's gRPC probes speak no TLS). Absent: health on the main port only.
   */
  healthPort?: number;
}): Promise<GrpcServer> {
  const auth = opts.auth ?? authOff();
  const server = createServer(auth.serverTls());
  const health = new Health(opts.checks ?? []);
  const names = opts.services.map((s) => s.register(server, opts.log, auth));
  health.addToGrpcServer(server, names);
  const port = await bindServer(server, opts.host, opts.port);
  let probe: GrpcHttp2Server | undefined;
  let healthPort: number | undefined;
  if (opts.healthPort !== undefined) {
    probe = createServer();
    health.alsoServeOn(probe);
    healthPort = await bindServer(probe, opts.host, opts.healthPort).catch(async (err: unknown) => {
      server.forceShutdown();
      throw err;
    });
  }
  health.setServing(true);
  return {
    port,
    ...(healthPort !== undefined ? { healthPort } : {}),
    health,
    async stop(graceMs = 10_000) {
      health.setServing(false);
      await shutdownServer(server, graceMs);
      if (probe) await shutdownServer(probe, 1_000);
      health.stop();
    },
  };
}
