import { createRequire } from "node:module";
import { Metadata } from "@grpc/grpc-js";
import type { InMemorySpanExporter, ReadableSpan } from "@opentelemetry/sdk-trace-base";
import { InferenceService, Operation } from "@tollgate/proto/inference";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type Client,
  createClient,
  type GrpcServer,
  GrpcStatus,
  type Handlers,
  implement,
  type MethodsOf,
  StatusError,
  serveGrpc,
} from "./grpc.js";
import type { MetadataLike } from "./tracing.js";
import {
  activeSpan,
  extractHeaders,
  extractMetadata,
  flushTracing,
  initTracing,
  injectHeaders,
  injectMetadata,
  SpanKind,
  shutdownTracing,
  startSpan,
  tracingEnabled,
  tracingOptions,
  withSpan,
} from "./tracing.js";

// The SDK packages are CommonJS: once anything loads them, they sit in require.cache.
const SDK_MODULE = /[\\/]@opentelemetry[\\/](sdk-trace|exporter-|otlp-|resources|core|context-async-hooks)/;
const sdkModulesLoaded = () =>
  Object.keys(createRequire(import.meta.url).cache).filter((p) => SDK_MODULE.test(p));

const TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const encoder = new TextEncoder();

/** What the server handlers saw, per request id. */
const seen = new Map<string, { traceparent: unknown; activeTraceId: string | undefined }>();
const record = (id: string, metadata: MetadataLike) =>
  seen.set(id, {
    traceparent: metadata.get("traceparent")[0],
    activeTraceId: activeSpan()?.spanContext().traceId,
  });

const handlers: Handlers<typeof InferenceService> = {
  async complete(req, ctx) {
    record(req.input?.requestId ?? "", ctx.metadata);
    if (req.input?.model === "refuse")
      throw new StatusError(GrpcStatus.NOT_FOUND, "model_not_found", "no such model");
    return { body: encoder.encode("{}") };
  },
  async *streamComplete(req, ctx) {
    record(req.input?.requestId ?? "", ctx.metadata);
    for (let i = 0; i < 3; i++) yield { event: { case: "chunk", value: encoder.encode(`c${i}`) } };
  },
};

const input = (requestId: string, model = "m") => ({
  input: { requestId, operation: Operation.CHAT, model, body: encoder.encode("{}") },
});

describe("tracing", () => {
  let server: GrpcServer;
  let client: Client<MethodsOf<typeof InferenceService>>;
  // Created once the "off" test has shown the SDK unloaded: importing it loads it.
  let exporter: InMemorySpanExporter;
  const log = pino({ level: "silent" });

  beforeAll(async () => {
    server = await serveGrpc({
      host: "127.0.0.1",
      port: 0,
      log,
      services: [
        implement(InferenceService, handlers, { complete: ["api-edge"], streamComplete: ["api-edge"] }),
      ],
    });
    client = createClient(InferenceService, `127.0.0.1:${server.port}`);
    await client.$ready(5_000);
  });

  afterAll(async () => {
    await shutdownTracing();
    client?.$close();
    await server?.stop(1_000);
  });

  it("reads the standard OTel variables, and stays off without an endpoint", () => {
    expect(tracingOptions({}, "auth-policy")).toBeUndefined();
    expect(tracingOptions({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318/" }, "auth-policy")).toEqual({
      tracesUrl: "http://c:4318/v1/traces",
      serviceName: "auth-policy",
    });
    expect(
      tracingOptions(
        {
          OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318",
          OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://t:9999/traces",
          OTEL_SERVICE_NAME: "edge-eu",
        },
        "api-edge",
      ),
    ).toEqual({ tracesUrl: "http://t:9999/traces", serviceName: "edge-eu" });
    expect(
      tracingOptions({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SDK_DISABLED: "true" }, "x"),
    ).toBeUndefined();
  });

  // Runs before initTracing: tracing is off in this process until then.
  it("off: loads no SDK module, records nothing and sends no trace context over gRPC", async () => {
    expect(tracingEnabled()).toBe(false);
    const span = startSpan("anything", SpanKind.SERVER, { a: 1 });
    expect(span.isRecording()).toBe(false);
    expect(await withSpan("work", {}, async (s) => s.isRecording())).toBe(false);
    // An incoming traceparent is not parsed into anything either.
    const headers: Record<string, string> = {};
    injectHeaders(headers, startSpan("x", SpanKind.CLIENT));
    expect(headers).toEqual({});

    await client.complete(input("off-unary"));
    for await (const _ of client.streamComplete(input("off-stream"))) {
      // drain
    }
    for (const id of ["off-unary", "off-stream"])
      expect(seen.get(id)).toEqual({ traceparent: undefined, activeTraceId: undefined });
    expect(sdkModulesLoaded()).toEqual([]);
  });

  it("on: loads the SDK and propagates W3C trace context through HTTP headers and gRPC metadata", async () => {
    exporter = new (await import("@opentelemetry/sdk-trace-base")).InMemorySpanExporter();
    await initTracing({ tracesUrl: "http://127.0.0.1:1/v1/traces", serviceName: "kit-test" }, log, exporter);
    expect(tracingEnabled()).toBe(true);
    // The check above can fail: the SDK is now loaded.
    expect(sdkModulesLoaded().length).toBeGreaterThan(0);

    const remote = extractHeaders({ traceparent: TRACEPARENT, "content-type": "application/json" });
    const span = startSpan("edge", SpanKind.SERVER, {}, remote);
    expect(span.isRecording()).toBe(true);
    expect(span.spanContext().traceId).toBe("0af7651916cd43dd8448eb211c80319c");

    const headers: Record<string, string> = {};
    injectHeaders(headers, span);
    expect(headers.traceparent).toMatch(
      new RegExp(`^00-0af7651916cd43dd8448eb211c80319c-${span.spanContext().spanId}-01$`),
    );
    const metadata = new Metadata();
    injectMetadata(metadata, span);
    expect(metadata.get("traceparent")).toEqual([headers.traceparent]);
    const back = startSpan("child", SpanKind.SERVER, {}, extractMetadata(metadata));
    expect(back.spanContext().traceId).toBe(span.spanContext().traceId);
    back.end();
    span.end();
    // No traceparent: a new root, not an error.
    expect(
      startSpan("root", SpanKind.SERVER, {}, extractMetadata(new Metadata())).spanContext().traceId,
    ).not.toBe(span.spanContext().traceId);
  });

  it("on: the bridge makes a client span per call and a server span under it, unary and streamed", async () => {
    exporter.reset();
    const parent = await withSpan("request", { kind: SpanKind.SERVER }, async (root) => {
      await client.complete(input("on-unary"));
      for await (const _ of client.streamComplete(input("on-stream"))) {
        // drain
      }
      await client.complete(input("on-refused", "refuse")).catch(() => undefined);
      return root.spanContext();
    });
    await flushTracing();
    const spans = exporter.getFinishedSpans();
    const named = (name: string, kind: SpanKind) =>
      spans.filter((s) => s.name === `tollgate.inference.v1.InferenceService/${name}` && s.kind === kind);

    for (const method of ["Complete", "StreamComplete"]) {
      const clients = named(method, SpanKind.CLIENT);
      const servers = named(method, SpanKind.SERVER);
      expect(clients.length).toBeGreaterThan(0);
      for (const c of clients) {
        expect(c.spanContext().traceId).toBe(parent.traceId);
        expect(c.parentSpanContext?.spanId).toBe(parent.spanId);
        expect(c.attributes).toMatchObject({
          "rpc.system": "grpc",
          "rpc.service": "tollgate.inference.v1.InferenceService",
          "rpc.method": method,
        });
        // Each client span has exactly one server span as its child.
        const children = servers.filter((s) => s.parentSpanContext?.spanId === c.spanContext().spanId);
        expect(children).toHaveLength(1);
      }
    }
    // The handler ran inside its server span, and saw the caller's traceparent.
    for (const id of ["on-unary", "on-stream"]) {
      expect(seen.get(id)?.activeTraceId).toBe(parent.traceId);
      expect(String(seen.get(id)?.traceparent)).toContain(parent.traceId);
    }
    const ok = spans.find(
      (s: ReadableSpan) =>
        s.kind === SpanKind.CLIENT && s.attributes["rpc.grpc.status_code"] === GrpcStatus.OK,
    );
    expect(ok).toBeDefined();
    // A refusal: the client span fails with the domain code; for the server it is the caller's
    // fault (NOT_FOUND), so its span carries the code but is not an error.
    const refusedClient = named("Complete", SpanKind.CLIENT).find(
      (s) => s.attributes["rpc.grpc.status_code"] === GrpcStatus.NOT_FOUND,
    );
    expect(refusedClient?.attributes["error.type"]).toBe("model_not_found");
    expect(refusedClient?.status.code).toBe(2);
    const refusedServer = spans.find(
      (s) =>
        s.kind === SpanKind.SERVER && s.parentSpanContext?.spanId === refusedClient?.spanContext().spanId,
    );
    expect(refusedServer?.attributes).toMatchObject({ "rpc.grpc.status_code": GrpcStatus.NOT_FOUND });
    expect(refusedServer?.status.code).toBe(0);
  });

  it("bounds the shutdown flush when the receiver never answers", async () => {
    await shutdownTracing();
    const hanging = { export: () => {}, shutdown: () => new Promise<void>(() => {}) };
    await initTracing({ tracesUrl: "http://127.0.0.1:1/v1/traces", serviceName: "kit-test" }, log, hanging);
    startSpan("last", SpanKind.SERVER).end();
    const started = performance.now();
    await shutdownTracing(log, 200);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(tracingEnabled()).toBe(false);
  });
});
