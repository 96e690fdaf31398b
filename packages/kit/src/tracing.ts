import { randomUUID } from "node:crypto";
import {
  type Attributes,
  type Context,
  context,
  INVALID_SPAN_CONTEXT,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type TextMapGetter,
  type TextMapSetter,
  trace,
} from "@opentelemetry/api";
// Types only: erased at build time, so importing this module never loads the SDK.
import type { SpanExporter } from "@opentelemetry/sdk-trace-base";
import type { Logger } from "pino";
import { z } from "zod";

export type { Attributes, Context, Span } from "@opentelemetry/api";
export { SpanKind } from "@opentelemetry/api";

/**
 * Attribute names used across services. OpenTelemetry semantic conventions where one exists
 * (GenAI, RPC and HTTP names as of semconv 1.37); `tollgate.*` for our own. Values are ids,
 * model names, counts and codes: never prompt text, keys, credentials, addresses, receipts or
 * idempotency keys.
 */
export const ATTR = {
  genAiOperation: "gen_ai.operation.name",
  genAiProvider: "gen_ai.provider.name",
  /** The pre-1.37 name of gen_ai.provider.name, still what many backends group by. */
  genAiSystem: "gen_ai.system",
  genAiRequestModel: "gen_ai.request.model",
  genAiResponseModel: "gen_ai.response.model",
  genAiMaxTokens: "gen_ai.request.max_tokens",
  genAiInputTokens: "gen_ai.usage.input_tokens",
  genAiOutputTokens: "gen_ai.usage.output_tokens",
  rpcSystem: "rpc.system",
  rpcService: "rpc.service",
  rpcMethod: "rpc.method",
  rpcGrpcStatus: "rpc.grpc.status_code",
  httpMethod: "http.request.method",
  httpRoute: "http.route",
  httpStatus: "http.response.status_code",
  serverAddress: "server.address",
  serverPort: "server.port",
  errorType: "error.type",
  door: "tollgate.door",
  upstream: "tollgate.upstream",
  upstreamAttempt: "upstream.attempt",
} as const;

/** The GenAI operation name (semantic conventions) of a chat or a text completion. */
export function genAiOperation(
  operation: "chat" | "text" | "embeddings",
): "chat" | "text_completion" | "embeddings" {
  return operation === "text" ? "text_completion" : operation;
}

/**
 * The standard OpenTelemetry variables, for a service's config schema (`...otelEnv`). Traces
 * go out only when an endpoint is set; OTEL_SDK_DISABLED=true turns them off regardless.
 */
export const otelEnv = {
  /** Base URL of an OTLP/HTTP receiver; traces go to <base>/v1/traces. */
  OTEL_EXPORTER_OTLP_ENDPOINT: z.url().optional(),
  /** Full URL for traces; wins over OTEL_EXPORTER_OTLP_ENDPOINT. */
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: z.url().optional(),
  /** Default: the service's own name. */
  OTEL_SERVICE_NAME: z.string().min(1).optional(),
  OTEL_SDK_DISABLED: z.enum(["true", "false"]).optional(),
};

/** The parsed values of `otelEnv`. */
export type OtelEnv = { [K in keyof typeof otelEnv]?: string | undefined };

/** Where and as whom a process exports traces. */
export interface TracingOptions {
  /** The OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces. */
  tracesUrl: string;
  serviceName: string;
  serviceVersion?: string;
}

/** Tracing settings from the parsed OTel variables; undefined (tracing off) without an endpoint. */
export function tracingOptions(e: OtelEnv, service: string): TracingOptions | undefined {
  if (e.OTEL_SDK_DISABLED === "true") return undefined;
  const base = e.OTEL_EXPORTER_OTLP_ENDPOINT?.replace(/\/+$/, "");
  const tracesUrl = e.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? (base ? `${base}/v1/traces` : undefined);
  return tracesUrl ? { tracesUrl, serviceName: e.OTEL_SERVICE_NAME ?? service } : undefined;
}

/** The SDK pieces kept once tracing is on. */
interface Sdk {
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

let sdk: Sdk | undefined;

/**
 * Whether spans are recorded in this process. Off (the default) nothing but
 * `@opentelemetry/api`'s no-op tracer exists, and callers skip all span work behind this check.
 */
export function tracingEnabled(): boolean {
  return sdk !== undefined;
}

/**
 * Turns tracing on: loads the SDK (a dynamic import, so a process without an endpoint never
 * loads it), exports batches over OTLP/HTTP JSON and propagates W3C trace context only (no
 * baggage: callers on the public port cannot inject it). `undefined` options leave tracing off.
 * `exporter` replaces the OTLP exporter (tests collect spans in memory).
 */
export async function initTracing(
  opts: TracingOptions | undefined,
  log?: Logger,
  exporter?: SpanExporter,
): Promise<void> {
  if (!opts || sdk) return;
  const [{ BasicTracerProvider, BatchSpanProcessor }, { OTLPTraceExporter }, res, core, hooks, semconv] =
    await Promise.all([
      import("@opentelemetry/sdk-trace-base"),
      import("@opentelemetry/exporter-trace-otlp-http"),
      import("@opentelemetry/resources"),
      import("@opentelemetry/core"),
      import("@opentelemetry/context-async-hooks"),
      import("@opentelemetry/semantic-conventions"),
    ]);
  const provider = new BasicTracerProvider({
    resource: res.resourceFromAttributes({
      [semconv.ATTR_SERVICE_NAME]: opts.serviceName,
      ...(opts.serviceVersion ? { [semconv.ATTR_SERVICE_VERSION]: opts.serviceVersion } : {}),
      // Replicas share a service name; this tells their spans apart.
      "service.instance.id": randomUUID(),
    }),
    spanProcessors: [new BatchSpanProcessor(exporter ?? new OTLPTraceExporter({ url: opts.tracesUrl }))],
  });
  const contextManager = new hooks.AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  propagation.setGlobalPropagator(new core.W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  sdk = {
    flush: () => provider.forceFlush(),
    async shutdown() {
      await provider.shutdown();
      trace.disable();
      propagation.disable();
      context.disable();
    },
  };
  log?.info({ tracesUrl: new URL(opts.tracesUrl).origin, serviceName: opts.serviceName }, "tracing on");
}

/** Exports every finished span now (tests; shutdown does it too). */
export async function flushTracing(): Promise<void> {
  await sdk?.flush();
}

/**
 * Flushes and stops tracing (graceful shutdown); a failed export is logged, never thrown. A
 * receiver that does not answer gets `timeoutMs`: the exporter would otherwise retry for
 * seconds and hold the pod's termination.
 */
export async function shutdownTracing(log?: Logger, timeoutMs = 3_000): Promise<void> {
  const current = sdk;
  sdk = undefined;
  if (!current) return;
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), timeoutMs);
    timer.unref();
  });
  try {
    if ((await Promise.race([current.shutdown(), timedOut])) === "timeout")
      log?.warn({ timeoutMs }, "tracing flush timed out");
  } catch (err) {
    log?.warn({ err }, "tracing flush failed");
  } finally {
    clearTimeout(timer);
  }
}

const tracer = () => trace.getTracer("@tollgate/kit");

/** A span that records nothing, handed out when tracing is off. */
export const NOOP_SPAN: Span = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

/** Starts a span, a child of `parent` (default: the active context); no-op when tracing is off. */
export function startSpan(name: string, kind: SpanKind, attributes?: Attributes, parent?: Context): Span {
  if (!sdk) return NOOP_SPAN;
  return tracer().startSpan(
    name,
    { kind, ...(attributes ? { attributes } : {}) },
    parent ?? context.active(),
  );
}

/** Runs `fn` with `span` as the active span, so spans started inside become its children. */
export function runInSpan<T>(span: Span, fn: () => T): T {
  if (!sdk) return fn();
  return context.with(trace.setSpan(context.active(), span), fn);
}

/** The active span, or undefined when tracing is off or none is active. */
export function activeSpan(): Span | undefined {
  return sdk ? trace.getActiveSpan() : undefined;
}

/**
 * Marks a span failed with a closed error type (a domain code, a status), never the error's
 * message: messages can quote upstream text, and an attribute must never carry a prompt.
 */
export function failSpan(span: Span, errorType: string): void {
  span.setAttribute(ATTR.errorType, errorType);
  span.setStatus({ code: SpanStatusCode.ERROR });
}

/**
 * Runs `fn` inside a new span that ends when it settles; a throw marks the span failed with
 * `errorType(err)` (default "error"). Tracing off: just runs `fn` with a no-op span.
 */
export async function withSpan<T>(
  name: string,
  opts: { kind?: SpanKind; attributes?: Attributes; errorType?: (err: unknown) => string },
  fn: (span: Span) => Promise<T>,
): Promise<T> {
  if (!sdk) return fn(NOOP_SPAN);
  const span = startSpan(name, opts.kind ?? SpanKind.INTERNAL, opts.attributes);
  try {
    return await runInSpan(span, () => fn(span));
  } catch (err) {
    failSpan(span, opts.errorType?.(err) ?? "error");
    throw err;
  } finally {
    span.end();
  }
}

const contextWith = (span: Span | undefined): Context =>
  span ? trace.setSpan(context.active(), span) : context.active();

/** The part of grpc-js Metadata the propagation helpers use. */
export interface MetadataLike {
  get(key: string): Array<string | Buffer>;
  set(key: string, value: string): void;
}

const metadataGetter: TextMapGetter<MetadataLike> = {
  keys: () => [],
  get(carrier, key) {
    const value = carrier.get(key)[0];
    return typeof value === "string" ? value : undefined;
  },
};
const metadataSetter: TextMapSetter<MetadataLike> = {
  set: (carrier, key, value) => carrier.set(key, value),
};

/** Writes `span` (default: the active span) as the parent of the callee into gRPC metadata. */
export function injectMetadata(metadata: MetadataLike, span?: Span): void {
  propagation.inject(contextWith(span), metadata, metadataSetter);
}

/** Reads a remote parent from gRPC metadata; the root context when it carries none. */
export function extractMetadata(metadata: MetadataLike): Context {
  if (metadata.get("traceparent").length === 0) return ROOT_CONTEXT;
  return propagation.extract(ROOT_CONTEXT, metadata, metadataGetter);
}

type Headers = Record<string, string | string[] | undefined>;

const headerGetter: TextMapGetter<Headers> = {
  keys: (carrier) => Object.keys(carrier),
  get(carrier, key) {
    const value = carrier[key];
    return Array.isArray(value) ? value[0] : value;
  },
};

const headerSetter: TextMapSetter<Record<string, string>> = {
  set(carrier, key, value) {
    carrier[key] = value;
  },
};

/** Writes `span` (default: the active span) as the parent of the callee into HTTP request headers. */
export function injectHeaders(headers: Record<string, string>, span?: Span): void {
  propagation.inject(contextWith(span), headers, headerSetter);
}

/** Reads a remote parent from (lower-case) HTTP headers; the root context when they carry none. */
export function extractHeaders(headers: Headers): Context {
  if (headers.traceparent === undefined) return ROOT_CONTEXT;
  return propagation.extract(ROOT_CONTEXT, headers, headerGetter);
}
