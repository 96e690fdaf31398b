import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import {
  flushTracing,
  initTracing,
  type Span,
  SpanKind,
  shutdownTracing,
  withSpan,
} from "@tollgate/kit/tracing";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { ProviderRequest } from "../../domain/ports.js";
import { createAnthropicProvider } from "../anthropic/provider.js";
import { createOpenAICompatibleProvider } from "../openai-compatible/provider.js";

const PROMPT = "Tell me about the violet-heron-4411 lighthouse";
const exporter = new InMemorySpanExporter();
let fake: FakeUpstream;
let provider: ReturnType<typeof createOpenAICompatibleProvider>;

const chat = (stream = false): ProviderRequest => ({
  operation: "chat",
  body: {
    model: "fake-small",
    max_tokens: 4,
    messages: [{ role: "user", content: PROMPT }],
    ...(stream ? { stream: true, stream_options: { include_usage: true } } : {}),
  },
});

/** Runs `fn` under a request span, as the gRPC bridge does, and returns the exported spans. */
async function underRequest(fn: () => Promise<unknown>): Promise<{ root: Span; spans: ReadableSpan[] }> {
  exporter.reset();
  let root!: Span;
  await withSpan("request", { kind: SpanKind.SERVER }, async (span) => {
    root = span;
    await fn();
  });
  // A body dropped after [DONE] emits "close" on the next tick.
  await new Promise((resolve) => setImmediate(resolve));
  await flushTracing();
  return { root, spans: exporter.getFinishedSpans().filter((s) => s.name !== "request") };
}

const ms = (s: ReadableSpan) => s.duration[0] * 1e3 + s.duration[1] / 1e6;

describe("upstream client spans", () => {
  beforeAll(async () => {
    fake = await startFakeUpstream({ record: true });
    await initTracing(
      { tracesUrl: "http://127.0.0.1:1/v1/traces", serviceName: "router-test" },
      undefined,
      exporter,
    );
    provider = createOpenAICompatibleProvider({
      id: "fake",
      baseUrl: fake.url,
      timeouts: { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000, totalMs: 5_000 },
    });
  });

  beforeEach(() => fake.configure({ tokensPerSecond: 0 }));

  afterAll(async () => {
    await shutdownTracing();
    await provider?.close();
    await fake?.close();
  });

  it("sends traceparent and records one span per attempt, counting attempts per request", async () => {
    const { root, spans } = await underRequest(async () => {
      await provider.complete(chat(), new AbortController().signal);
      await provider.complete(chat(), new AbortController().signal);
    });
    expect(spans).toHaveLength(2);
    const [first, second] = spans as [ReadableSpan, ReadableSpan];
    for (const s of spans) {
      expect(s.name).toBe("chat fake-small");
      expect(s.kind).toBe(SpanKind.CLIENT);
      expect(s.spanContext().traceId).toBe(root.spanContext().traceId);
      expect(s.parentSpanContext?.spanId).toBe(root.spanContext().spanId);
      expect(s.attributes).toMatchObject({
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "fake-small",
        "gen_ai.request.max_tokens": 4,
        "server.address": "127.0.0.1",
        "server.port": fake.port,
        "http.response.status_code": 200,
        "tollgate.upstream": "fake",
      });
      expect(JSON.stringify(s.attributes)).not.toContain("violet-heron");
    }
    expect([first.attributes["upstream.attempt"], second.attributes["upstream.attempt"]]).toEqual([1, 2]);
    // The upstream received the attempt's own span as its parent.
    const sent = fake.requests.slice(-2).map((r) => r.headers.traceparent);
    expect(sent).toEqual(spans.map((s) => `00-${s.spanContext().traceId}-${s.spanContext().spanId}-01`));
  });

  it("keeps a stream's span open until the stream ends", async () => {
    fake.configure({ tokensPerSecond: 50 });
    let chunks = 0;
    const { spans } = await underRequest(async () => {
      for await (const _ of provider.stream(chat(true), new AbortController().signal)) chunks++;
    });
    expect(chunks).toBeGreaterThan(3);
    expect(spans).toHaveLength(1);
    // Four tokens at 50/s: the span covers their pacing, not just the response headers.
    expect(ms(spans[0]!)).toBeGreaterThan(50);
    expect(spans[0]!.attributes["upstream.attempt"]).toBe(1);
  });

  it("marks a failed attempt with its status", async () => {
    fake.failNext(1, { status: 503 });
    const { spans } = await underRequest(() =>
      provider.complete(chat(), new AbortController().signal).catch(() => undefined),
    );
    expect(spans).toHaveLength(1);
    expect(spans[0]!.attributes).toMatchObject({ "http.response.status_code": 503, "error.type": "503" });
    expect(spans[0]!.status.code).toBe(2);
  });

  it("names the Anthropic wire format on an anthropic upstream's spans, and propagates the trace", async () => {
    const anthropic = createAnthropicProvider({
      id: "claude",
      baseUrl: fake.url.replace(/\/v1$/, ""),
      timeouts: { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000, totalMs: 5_000 },
    });
    try {
      const { root, spans } = await underRequest(() =>
        anthropic.complete(chat(), new AbortController().signal),
      );
      expect(spans).toHaveLength(1);
      expect(spans[0]!.name).toBe("chat fake-small");
      expect(spans[0]!.attributes).toMatchObject({
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.max_tokens": 4,
        "http.response.status_code": 200,
        "tollgate.upstream": "claude",
      });
      expect(spans[0]!.spanContext().traceId).toBe(root.spanContext().traceId);
      expect(fake.requests.at(-1)?.path).toBe("/v1/messages");
      expect(fake.requests.at(-1)?.headers.traceparent).toContain(root.spanContext().traceId);
    } finally {
      await anthropic.close();
    }
  });
});
