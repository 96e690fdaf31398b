import type { AddressInfo } from "node:net";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace-base";
import { activeSpan, flushTracing, initTracing, SpanKind, shutdownTracing } from "@tollgate/kit/tracing";
import Fastify, { type FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { traceRequests } from "./tracing.js";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER = "00f067aa0ba902b7";

/** A server with and one without tracing hooks, and what each handler saw. */
function server(): { app: FastifyInstance; seen: Array<string | undefined> } {
  const app = Fastify();
  const seen: Array<string | undefined> = [];
  traceRequests(app);
  app.post("/v1/chat/completions", async (req) => {
    // After the body was parsed: the request's span must be the active one here.
    seen.push(activeSpan()?.spanContext().traceId);
    return { echoed: (req.body as { n: number }).n };
  });
  app.post("/v1/mpp/chat/completions", async (_req, reply) => reply.code(502).send({}));
  return { app, seen };
}

describe("api-edge request spans", () => {
  const exporter = new InMemorySpanExporter();
  let off: ReturnType<typeof server>;
  let on: ReturnType<typeof server>;
  let url: string;

  beforeAll(async () => {
    off = server();
    await initTracing(
      { tracesUrl: "http://127.0.0.1:1/v1/traces", serviceName: "edge-test" },
      undefined,
      exporter,
    );
    on = server();
    await on.app.listen({ host: "127.0.0.1", port: 0 });
    url = `http://127.0.0.1:${(on.app.server.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    await on?.app.close();
    await shutdownTracing();
  });

  const post = (path: string, headers: Record<string, string> = {}) =>
    fetch(`${url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ n: 1 }),
    });

  it("adds no hook while tracing is off", () => {
    expect(off.app.printRoutes({ includeHooks: true })).not.toContain("onRequest");
    expect(on.app.printRoutes({ includeHooks: true })).toContain("onRequest");
  });

  it("continues the caller's traceparent, names the span by route and runs the handler inside it", async () => {
    exporter.reset();
    const res = await post("/v1/chat/completions", { traceparent: `00-${TRACE}-${CALLER}-01` });
    expect(res.status).toBe(200);
    await res.text();
    expect((await post("/v1/mpp/chat/completions")).status).toBe(502);
    await flushTracing();
    const spans = exporter.getFinishedSpans();
    const chat = spans.find((s) => s.name === "POST /v1/chat/completions");
    expect(chat?.kind).toBe(SpanKind.SERVER);
    expect(chat?.spanContext().traceId).toBe(TRACE);
    expect(chat?.parentSpanContext?.spanId).toBe(CALLER);
    expect(chat?.attributes).toEqual({
      "http.request.method": "POST",
      "http.route": "/v1/chat/completions",
      "tollgate.door": "account",
      "http.response.status_code": 200,
    });
    expect(on.seen).toEqual([TRACE]);
    const paid = spans.find((s) => s.name === "POST /v1/mpp/chat/completions");
    expect(paid?.spanContext().traceId).not.toBe(TRACE);
    expect(paid?.attributes).toMatchObject({ "tollgate.door": "paid", "http.response.status_code": 502 });
    expect(paid?.status.code).toBe(2);
  });
});
