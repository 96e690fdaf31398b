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
import { type CallHead, Channel, MAX_MESSAGE_BYTES } from "./channel.js";
import { type AccessTable, authOff, decide, type InternalAuth } from "./credentials.js";
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
  NOOP_SPAN,
  runInSpan,
  type Span,
  SpanKind,
  startSpan,
  tracingEnabled,
} from "./tracing.js";

export { status as GrpcStatus } from "@grpc/grpc-js";
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
  metadata: grpc.Metadata;
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

function deserializer(schema: DescMessage) {
  return (buf: Buffer) => decodeMessage(schema, buf);
}

/** Builds the grpc-js service definition of a protobuf-es service descriptor. */
export function grpcDefinition(service: DescService): grpc.ServiceDefinition {
  const def: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const m of service.methods) {
    def[m.localName] = {
      path: `/${service.typeName}/${m.name}`,
      requestStream: m.methodKind === "client_streaming" || m.methodKind === "bidi_streaming",
      responseStream: m.methodKind === "server_streaming" || m.methodKind === "bidi_streaming",
      requestSerialize: serializer(m.input),
      requestDeserialize: deserializer(m.input),
      responseSerialize: serializer(m.output),
      responseDeserialize: deserializer(m.output),
      originalName: m.localName,
    };
  }
  return def as grpc.ServiceDefinition;
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

/** Maps a thrown value to a gRPC status object; unknown failures become INTERNAL without detail. */
export function toServiceError(err: unknown, log: Logger, method: string): Partial<grpc.StatusObject> {
  if (err instanceof StatusError) {
    const metadata = new grpc.Metadata();
    metadata.set(ERROR_CODE_KEY, err.code);
    for (const [name, value] of Object.entries(err.details)) metadata.set(ERROR_DETAIL_PREFIX + name, value);
    return { code: err.status, details: err.message, metadata };
  }
  const metadata = new grpc.Metadata();
  if (isRedisUnavailable(err)) {
    // Redis down or restarting: the caller may retry (HTTP 503), nothing is wrong with the call.
    log.warn({ err, method }, "store unavailable");
    metadata.set(ERROR_CODE_KEY, STORE_UNAVAILABLE);
    return { code: grpc.status.UNAVAILABLE, details: "store unavailable", metadata };
  }
  log.error({ err, method }, "handler failed");
  metadata.set(ERROR_CODE_KEY, "internal");
  return { code: grpc.status.INTERNAL, details: "internal error", metadata };
}

/** A call's context plus whether its caller went away, read without making a signal. */
interface CallState {
  ctx: CallContext;
  cancelled(): boolean;
  /** Set once the handler has answered (or failed): a later cancel aborts nothing. */
  settled: boolean;
}

/**
 * The context of one call. Its AbortSignal is made on the first read of `ctx.signal`: most
 * handlers (auth-policy's) never read it, and an AbortController per call is measurable on
 * the request path. A signal made after the caller went away starts aborted.
 */
function contextOf(
  call: grpc.ServerUnaryCall<unknown, unknown> | grpc.ServerWritableStream<unknown, unknown>,
): CallState {
  let controller: AbortController | undefined;
  let cancelled = false;
  // grpc-js also emits "cancelled" after a call's status went out: the handler is done by then,
  // and aborting its signal would only make a DOMException (its stack) per call.
  call.once("cancelled", () => {
    if (cancelled) return;
    cancelled = true;
    if (!state.settled) controller?.abort();
  });
  const ctx: CallContext = {
    get signal() {
      if (!controller) {
        controller = new AbortController();
        if (cancelled) controller.abort();
      }
      return controller.signal;
    },
    metadata: call.metadata,
  };
  const state: CallState = { ctx, cancelled: () => cancelled, settled: false };
  return state;
}

/**
 * Waits until a full stream can take more, or the caller cancels. Waiting on "drain" alone
 * would park a handler forever when a slow caller goes away, and its cleanup (billing the
 * tokens produced) would never run.
 */
function drainOrCancel(call: grpc.ServerWritableStream<unknown, unknown>, state: CallState): Promise<void> {
  if (state.cancelled()) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      call.off("drain", done);
      call.off("cancelled", done);
      resolve();
    };
    call.once("drain", done);
    call.once("cancelled", done);
  });
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
  call: grpc.ServerUnaryCall<unknown, unknown> | grpc.ServerWritableStream<unknown, unknown>,
  m: DescMethod,
  log: Logger,
): Partial<grpc.StatusObject> | undefined {
  if (!check || check.auth.mode === "off") return undefined;
  const caller = check.auth.identify(call);
  const decision = decide(check.access as Record<string, readonly never[]>, m.localName, caller);
  if (decision === "allow") return undefined;
  const metadata = new grpc.Metadata();
  metadata.set(ERROR_CODE_KEY, decision);
  log.warn({ method: m.name, caller: caller ?? null, decision }, "internal call refused");
  return decision === "unauthenticated"
    ? { code: grpc.status.UNAUTHENTICATED, details: "unauthenticated", metadata }
    : { code: grpc.status.PERMISSION_DENIED, details: `${caller} may not call ${m.name}`, metadata };
}

/**
 * Adapts promise/async-iterable handlers to grpc-js callbacks and registers them on `server`.
 * With `check`, each call is first checked against the service's access table.
 */
export function addService<M extends GenServiceMethods>(
  server: grpc.Server,
  service: GenService<M>,
  handlers: ServiceHandlers<M>,
  log: Logger,
  check?: CallerCheck,
): void {
  const impl: grpc.UntypedServiceImplementation = {};
  for (const m of service.methods as DescMethod[]) {
    const handler = (handlers as Record<string, unknown>)[m.localName] as (
      req: unknown,
      ctx: CallContext,
    ) => unknown;
    const rpc = rpcSpec(service, m);
    // Tracing off: no span, no metadata lookup; the handler runs in the caller's context.
    const serverSpan = (metadata: grpc.Metadata) =>
      tracingEnabled()
        ? startSpan(rpc.name, SpanKind.SERVER, rpc.attributes, extractMetadata(metadata))
        : NOOP_SPAN;
    if (m.methodKind === "unary") {
      impl[m.localName] = (
        call: grpc.ServerUnaryCall<unknown, unknown>,
        callback: grpc.sendUnaryData<unknown>,
      ) => {
        const refused = refusal(check, call, m, log);
        if (refused) return callback(refused);
        const state = contextOf(call);
        const span = serverSpan(call.metadata);
        runInSpan(span, () => handler(call.request, state.ctx) as Promise<unknown>).then(
          (res) => {
            state.settled = true;
            endRpcSpan(span, SpanKind.SERVER, grpc.status.OK);
            callback(null, res);
          },
          (err: unknown) => {
            state.settled = true;
            // A caller that went away is not a failure of this service: nothing to log.
            const gone = state.cancelled();
            const status = gone
              ? { code: grpc.status.CANCELLED, details: "cancelled by the caller" }
              : toServiceError(err, log, m.name);
            const errorType = gone ? "cancelled" : errorTypeOf(err);
            endRpcSpan(span, SpanKind.SERVER, status.code ?? grpc.status.UNKNOWN, errorType);
            callback(status);
          },
        );
      };
    } else if (m.methodKind === "server_streaming") {
      impl[m.localName] = (call: grpc.ServerWritableStream<unknown, unknown>) => {
        const refused = refusal(check, call, m, log);
        if (refused) {
          call.emit("error", refused);
          return;
        }
        const state = contextOf(call);
        const span = serverSpan(call.metadata);
        void runInSpan(span, async () => {
          let code = grpc.status.OK;
          let errorType: string | undefined;
          try {
            for await (const msg of handler(call.request, state.ctx) as AsyncIterable<unknown>) {
              if (state.cancelled()) return;
              if (!call.write(msg)) await drainOrCancel(call, state);
            }
            call.end();
          } catch (err) {
            errorType = state.cancelled() ? "cancelled" : errorTypeOf(err);
            if (!state.cancelled()) {
              const status = toServiceError(err, log, m.name);
              code = status.code ?? grpc.status.UNKNOWN;
              call.emit("error", status);
            }
          } finally {
            state.settled = true;
            endRpcSpan(span, SpanKind.SERVER, state.cancelled() ? grpc.status.CANCELLED : code, errorType);
          }
        });
      };
    } else {
      throw new Error(`streaming kind ${m.methodKind} is not supported by the bridge`);
    }
  }
  server.addService(grpcDefinition(service), impl);
}

/**
 * Creates a gRPC server: keepalive pings suited to long streams, and the largest message it
 * takes (the same limit the client channel keeps, channel.ts).
 */
export function createServer(): grpc.Server {
  return new grpc.Server({
    "grpc.keepalive_time_ms": 30_000,
    "grpc.keepalive_timeout_ms": 10_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    "grpc.http2.min_ping_interval_without_data_ms": 10_000,
    // Clients re-resolve DNS only when a connection ends: ending each after five minutes lets
    // replicas added by a scale-up receive calls. The grace is unlimited, so no call is cut.
    "grpc.max_connection_age_ms": 5 * 60_000,
  });
}

/** Binds `server` to host:port (port 0 picks a free one) and resolves to the bound port. */
export function bindServer(
  server: grpc.Server,
  host: string,
  port: number,
  credentials: grpc.ServerCredentials = grpc.ServerCredentials.createInsecure(),
): Promise<number> {
  return new Promise((resolve, reject) => {
    server.bindAsync(`${host}:${port}`, credentials, (err, bound) => (err ? reject(err) : resolve(bound)));
  });
}

/** Stops accepting calls, lets in-flight calls finish for up to `graceMs`, then forces. */
export function shutdownServer(server: grpc.Server, graceMs = 10_000): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      server.forceShutdown();
      resolve();
    }, graceMs);
    server.tryShutdown(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** The error a client call rejects with for a gRPC status (a RemoteError when it carries a code). */
export function toRemoteError(err: unknown): Error {
  const e = err as grpc.ServiceError;
  if (typeof e?.code !== "number") return err as Error;
  return remoteErrorOf(e.code, e.details ?? e.message, e.metadata?.getMap() ?? {});
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
  register(server: grpc.Server, log: Logger, auth: InternalAuth): string;
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
  const server = createServer();
  const health = new Health(opts.checks ?? []);
  const names = opts.services.map((s) => s.register(server, opts.log, auth));
  health.addToGrpcServer(server, names);
  const port = await bindServer(server, opts.host, opts.port, auth.serverCredentials());
  let probe: grpc.Server | undefined;
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
