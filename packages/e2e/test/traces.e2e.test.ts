import { randomBytes } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/** One span as an OTLP/HTTP JSON export carries it, with its resource's service name. */
interface ReceivedSpan {
  service: string;
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  /** OTLP kinds: 2 server, 3 client. */
  kind: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, string | number | boolean>;
}

const SERVER = 2;
const CLIENT = 3;

type OtlpValue = {
  stringValue?: string;
  intValue?: string | number;
  boolValue?: boolean;
  doubleValue?: number;
};
type OtlpAttribute = { key: string; value: OtlpValue };

const otlpValue = (v: OtlpValue): string | number | boolean =>
  v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : (v.boolValue ?? v.doubleValue ?? ""));

/** Decodes one OTLP/HTTP JSON ExportTraceServiceRequest. */
function decode(body: string): ReceivedSpan[] {
  const req = JSON.parse(body) as {
    resourceSpans?: Array<{
      resource?: { attributes?: OtlpAttribute[] };
      scopeSpans?: Array<{ spans?: Array<Record<string, unknown>> }>;
    }>;
  };
  const out: ReceivedSpan[] = [];
  for (const rs of req.resourceSpans ?? []) {
    const service = String(
      otlpValue(rs.resource?.attributes?.find((a) => a.key === "service.name")?.value ?? {}),
    );
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        out.push({
          service,
          traceId: String(s.traceId),
          spanId: String(s.spanId),
          parentSpanId: String(s.parentSpanId ?? ""),
          name: String(s.name),
          kind: Number(s.kind),
          startNs: BigInt(s.startTimeUnixNano as string),
          endNs: BigInt(s.endTimeUnixNano as string),
          attributes: Object.fromEntries(
            ((s.attributes ?? []) as OtlpAttribute[]).map((a) => [a.key, otlpValue(a.value)]),
          ),
        });
      }
    }
  }
  return out;
}

/** An OTLP/HTTP receiver: POST /v1/traces with JSON, as the services' exporter sends it. */
async function startReceiver(): Promise<{
  url: string;
  bodies: string[];
  spans: ReceivedSpan[];
  server: Server;
}> {
  const bodies: string[] = [];
  const spans: ReceivedSpan[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const type = req.headers["content-type"] ?? "";
      if (req.method !== "POST" || req.url !== "/v1/traces" || !type.startsWith("application/json")) {
        res.writeHead(400).end();
        bodies.push(`unexpected ${req.method} ${req.url} ${type}`);
        return;
      }
      const body = Buffer.concat(chunks).toString("utf8");
      bodies.push(body);
      spans.push(...decode(body));
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, bodies, spans, server };
}

const ms = (s: ReceivedSpan) => Number(s.endNs - s.startNs) / 1e6;

/** The trace as an indented tree: name, service and duration of every hop. */
function renderTree(spans: ReceivedSpan[], root: ReceivedSpan): string {
  const lines: string[] = [];
  const walk = (s: ReceivedSpan, depth: number) => {
    lines.push(`${"  ".repeat(depth)}${s.name}  [${s.service}]  ${ms(s).toFixed(1)} ms`);
    const children = spans
      .filter((c) => c.parentSpanId === s.spanId)
      .sort((a, b) => (a.startNs < b.startNs ? -1 : 1));
    for (const c of children) walk(c, depth + 1);
  };
  walk(root, 0);
  return lines.join("\n");
}

const namespace = uniqueNamespace("traces");
/** Prompt text that must never reach a span. */
const MARKER = `saffron-${randomBytes(6).toString("hex")}`;
const PROMPT = `Write a haiku about the ${MARKER} lighthouse`;
const IDEMPOTENCY_KEY = `idem-${randomBytes(8).toString("hex")}`;
/** A caller's own trace: api-edge continues it. */
const CALLER_TRACE = randomBytes(16).toString("hex");
const CALLER_SPAN = randomBytes(8).toString("hex");

describe("OpenTelemetry traces across the multi-process stack", () => {
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  let receiver: Awaited<ReturnType<typeof startReceiver>>;
  const usage: Record<string, { input: number; output: number }> = {};

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    receiver = await startReceiver();
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 1,
      serviceEnv: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url },
    });
    const client = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: stack.demoKey, maxRetries: 0 });
    const buffered = await client.chat.completions.create(
      { model: "tollgate-mini", max_tokens: 5, messages: [{ role: "user", content: PROMPT }] },
      {
        headers: {
          traceparent: `00-${CALLER_TRACE}-${CALLER_SPAN}-01`,
          "idempotency-key": IDEMPOTENCY_KEY,
        },
      },
    );
    usage.buffered = { input: buffered.usage!.prompt_tokens, output: buffered.usage!.completion_tokens };
    const stream = await client.chat.completions.create({
      model: "tollgate-mini",
      max_tokens: 4,
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: "user", content: PROMPT }],
    });
    for await (const chunk of stream) {
      if (chunk.usage)
        usage.streamed = { input: chunk.usage.prompt_tokens, output: chunk.usage.completion_tokens };
    }
    // A graceful stop flushes every process's last spans (SIGTERM → drain → flush → exit).
    await stack.stop();
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
    await new Promise((resolve) => receiver?.server.close(resolve));
  });

  /** The spans of the trace whose root is api-edge's server span for the given request. */
  function traceOf(which: "buffered" | "streamed"): { spans: ReceivedSpan[]; root: ReceivedSpan } {
    const roots = receiver.spans.filter(
      (s) =>
        s.service === "api-edge" &&
        s.kind === SERVER &&
        s.name === "POST /v1/chat/completions" &&
        (which === "buffered" ? s.traceId === CALLER_TRACE : s.traceId !== CALLER_TRACE),
    );
    expect(roots, `one api-edge request span for the ${which} request`).toHaveLength(1);
    const root = roots[0]!;
    return { spans: receiver.spans.filter((s) => s.traceId === root.traceId), root };
  }

  it("exports OTLP/HTTP JSON only to /v1/traces", () => {
    expect(receiver.bodies.length).toBeGreaterThan(0);
    expect(receiver.bodies.filter((b) => b.startsWith("unexpected"))).toEqual([]);
  });

  for (const which of ["buffered", "streamed"] as const) {
    it(`one trace covers every hop of the ${which} request, as a tree rooted at api-edge`, () => {
      const { spans, root } = traceOf(which);
      console.log(`\ntrace of the ${which} chat request (${root.traceId}):\n${renderTree(spans, root)}\n`);

      // The root is api-edge's server span; for the buffered request it continues the caller's trace.
      expect(root.parentSpanId === "" || root.parentSpanId === CALLER_SPAN).toBe(true);
      if (which === "buffered") expect(root.parentSpanId).toBe(CALLER_SPAN);
      expect(root.attributes).toMatchObject({
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "tollgate.door": "account",
      });
      // Every other span hangs off a span of this trace: one tree.
      const ids = new Set(spans.map((s) => s.spanId));
      for (const s of spans) if (s !== root) expect(ids.has(s.parentSpanId), s.name).toBe(true);
      for (const s of spans) expect(s.endNs > s.startNs, `${s.name} has a positive duration`).toBe(true);
      // auth-policy appears when the request took a lease (or an exact hold); a request admitted on
      // a lease this edge already held makes no call there (docs/money.md, "Leases").
      const services = new Set(spans.map((s) => s.service));
      expect(services.has("api-edge") && services.has("inference-router")).toBe(true);
      expect([...services].every((n) => ["api-edge", "auth-policy", "inference-router"].includes(n))).toBe(
        true,
      );

      const child = (parent: ReceivedSpan, pred: (s: ReceivedSpan) => boolean) => {
        const found = spans.filter((s) => s.parentSpanId === parent.spanId && pred(s));
        expect(found, `a child of ${parent.name}`).toHaveLength(1);
        return found[0]!;
      };
      // api-edge → auth-policy, when the request was not admitted on a lease already held: a
      // client span (AcquireLease, or Authorize for an exact hold) and auth-policy's server span
      // under it. The first request of the key always makes it. The buffered request carries an
      // Idempotency-Key, so its key is checked alone first (an Authorize that takes nothing,
      // docs/contract.md, "Idempotency"), before its hold.
      const authCalls = spans.filter(
        (s) =>
          s.parentSpanId === root.spanId &&
          s.kind === CLIENT &&
          /^tollgate\.auth\.v1\.AuthService\/(AcquireLease|Authorize)$/.test(s.name),
      );
      if (which === "buffered") expect(authCalls, "the key's first request asks auth-policy").toHaveLength(2);
      else expect(authCalls.length).toBeLessThanOrEqual(1);
      const authHops = authCalls.map((authClient) => {
        const authServer = child(authClient, (s) => s.kind === SERVER);
        expect(authClient.attributes).toMatchObject({ "rpc.system": "grpc", "rpc.grpc.status_code": 0 });
        expect(authServer.service).toBe("auth-policy");
        return [authServer, authClient] as const;
      });

      // api-edge → inference-router → upstream.
      const method = which === "buffered" ? "Complete" : "StreamComplete";
      const routerClient = child(
        root,
        (s) => s.kind === CLIENT && s.name === `tollgate.inference.v1.InferenceService/${method}`,
      );
      const router = child(routerClient, (s) => s.kind === SERVER);
      expect(router.service).toBe("inference-router");
      const u = usage[which]!;
      expect(u.output).toBe(which === "buffered" ? 5 : 4);
      expect(router.attributes).toMatchObject({
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "tollgate-mini",
        "gen_ai.response.model": "tollgate-mini",
        "gen_ai.request.max_tokens": u.output,
        "gen_ai.usage.input_tokens": u.input,
        "gen_ai.usage.output_tokens": u.output,
        "tollgate.door": "account",
        "rpc.grpc.status_code": 0,
      });
      const upstream = child(router, (s) => s.kind === CLIENT);
      expect(upstream.name).toMatch(/^chat \S+$/);
      expect(upstream.attributes).toMatchObject({
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "server.address": "127.0.0.1",
        "http.response.status_code": 200,
        "upstream.attempt": 1,
      });
      expect(typeof upstream.attributes["gen_ai.request.model"]).toBe("string");
      // Each hop sits inside its parent's time.
      for (const [inner, outer] of [
        ...authHops,
        [router, routerClient] as const,
        [upstream, router] as const,
      ]) {
        expect(inner.startNs >= outer.startNs && inner.endNs <= outer.endNs + 5_000_000n, inner.name).toBe(
          true,
        );
      }
    });
  }

  it("no span carries the prompt, the Virtual Key, the idempotency key or an authorization", () => {
    const all = receiver.bodies.join("\n");
    expect(all).toContain("gen_ai.usage.output_tokens");
    for (const secret of [MARKER, stack.demoKey, IDEMPOTENCY_KEY, "Bearer", "authorization"])
      expect(
        all.includes(secret),
        `a span carries ${secret === stack.demoKey ? "the demo key" : secret}`,
      ).toBe(false);
  });
});
