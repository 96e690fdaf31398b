import { randomBytes } from "node:crypto";
import type { AllInOne } from "@tollgate/all-in-one";
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
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";
import { chartQueries, exportedNames, metricNames, unknownNames } from "./metric-names.js";

/** One sample of the text exposition: `name{labels} value`. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

interface Scrape {
  text: string;
  samples: Sample[];
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** Parses Prometheus text exposition (the subset prom-client writes). */
function parse(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`not an exposition line: ${line}`);
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? "").matchAll(LABEL)) labels[k!] = v!;
    samples.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return samples;
}

/** Sums the samples of `name` whose labels include `labels`, over one or more scrapes. */
function sum(scrapes: Scrape | Scrape[], name: string, labels: Record<string, string> = {}): number {
  return [scrapes]
    .flat()
    .flatMap((s) => s.samples)
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((total, s) => total + s.value, 0);
}

async function scrape(url: string): Promise<Scrape> {
  const res = await fetch(url);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/plain");
  const text = await res.text();
  return { text, samples: parse(text) };
}

const namespace = uniqueNamespace("metrics");
/** Prompt text and request ids that must never reach a metric line. */
const MARKER = `marigold-${randomBytes(6).toString("hex")}`;
const PROMPT = `Describe the ${MARKER} garden in detail`;
const REQUEST_IDS = [`${namespace}-buffered`, `${namespace}-streamed`];
const WRONG_KEY = `tg_wrong_${randomBytes(8).toString("hex")}`;

describe("Prometheus /metrics on every service of the multi-process stack", () => {
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  let scrapes: Record<string, Scrape>;

  const byPrefix = (prefix: string) =>
    Object.entries(scrapes)
      .filter(([name]) => name === prefix || name.startsWith(`${prefix}-`))
      .map(([, s]) => s);

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 2 });
    const client = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: stack.demoKey, maxRetries: 0 });

    // A buffered and a streamed chat through the official SDK, as a user would send them.
    const buffered = await client.chat.completions.create(
      { model: "tollgate-mini", max_tokens: 5, messages: [{ role: "user", content: PROMPT }] },
      { headers: { "x-request-id": REQUEST_IDS[0]! } },
    );
    expect(buffered.usage?.completion_tokens).toBe(5);
    const stream = await client.chat.completions.create(
      { model: "tollgate-mini", max_tokens: 4, stream: true, messages: [{ role: "user", content: PROMPT }] },
      { headers: { "x-request-id": REQUEST_IDS[1]! } },
    );
    let chunks = 0;
    for await (const _ of stream) chunks++;
    expect(chunks).toBeGreaterThan(0);

    // Refusals and a path no route serves, so statuses and outcomes other than ok show up.
    const wrong = await fetch(`${stack.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${WRONG_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "tollgate-mini", messages: [{ role: "user", content: PROMPT }] }),
    });
    expect(wrong.status).toBe(401);
    expect((await fetch(`${stack.url}/v1/${MARKER}`)).status).toBe(404);
    // An unpaid request on the paid door: mpp-payment issues a challenge.
    const unpaid = await fetch(`${stack.url}/v1/mpp/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        plan: "Starter",
        model_optimization: true,
        max_tokens: 4,
        messages: [{ role: "user", content: PROMPT }],
      }),
    });
    expect(unpaid.status).toBe(402);

    // metering consumes asynchronously: wait until both events are applied and the lag is 0.
    const deadline = Date.now() + 20_000;
    for (;;) {
      const m = await scrape(stack.metricsUrls.metering!);
      const recorded = sum(m, "tollgate_usage_events_total", { outcome: "recorded" });
      if (recorded >= 2 && sum(m, "tollgate_consumer_lag_messages") === 0) break;
      if (Date.now() > deadline) throw new Error(`metering did not catch up:\n${m.text}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    scrapes = Object.fromEntries(
      await Promise.all(
        Object.entries(stack.metricsUrls).map(async ([name, url]) => [name, await scrape(url)] as const),
      ),
    );
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  it("gives every service process its own endpoint, with process metrics and its name", () => {
    expect(Object.keys(scrapes).sort()).toEqual([
      "api-edge",
      "auth-policy",
      "inference-router-1",
      "inference-router-2",
      "metering",
      "mpp-payment",
    ]);
    for (const [name, s] of Object.entries(scrapes)) {
      expect(sum(s, "tollgate_service_info", { service: name.replace(/-\d+$/, "") })).toBe(1);
      expect(s.text).toMatch(/^tollgate_process_cpu_user_seconds_total \S+$/m);
    }
  });

  it("exports every tollgate_* metric the chart's alerts and dashboard query", () => {
    const exported = new Set(Object.values(scrapes).flatMap((s) => [...exportedNames(s.text)]));
    const queries = chartQueries();
    const used = new Set(queries.flatMap((q) => metricNames(q.expr)));
    // The dashboard and the alerts cover every service (helm/tollgate/alerts/tollgate.yaml).
    expect(used.size).toBeGreaterThan(20);
    for (const name of ["tollgate_usage_over_quote_total", "tollgate_consumer_lag_messages"])
      expect(used, name).toContain(name);
    expect(unknownNames(queries, exported)).toEqual([]);
  });

  it("answers 404 for anything but GET /metrics", async () => {
    const url = new URL(stack.metricsUrls["api-edge"]!);
    expect((await fetch(`${url.origin}/`)).status).toBe(404);
    expect((await fetch(`${url.origin}/v1/models`)).status).toBe(404);
  });

  it("api-edge counts requests by route template, method and status, and times them", () => {
    const edge = scrapes["api-edge"]!;
    const chat = { route: "/v1/chat/completions", method: "POST" };
    expect(sum(edge, "tollgate_http_requests_total", { ...chat, status: "200" })).toBe(2);
    expect(sum(edge, "tollgate_http_requests_total", { ...chat, status: "401" })).toBe(1);
    expect(
      sum(edge, "tollgate_http_requests_total", {
        route: "/v1/mpp/chat/completions",
        method: "POST",
        status: "402",
      }),
    ).toBe(1);
    // A path no route serves shares one label: the path as sent never becomes a series.
    expect(sum(edge, "tollgate_http_requests_total", { route: "unmatched", status: "404" })).toBe(1);
    expect(sum(edge, "tollgate_http_request_duration_seconds_count", { route: chat.route })).toBe(3);
    // Overhead is observed for the requests that ran a model: the two served chats.
    expect(sum(edge, "tollgate_gateway_overhead_seconds_count", { route: chat.route })).toBe(2);
    const overhead = sum(edge, "tollgate_gateway_overhead_seconds_sum", { route: chat.route });
    const total = sum(edge, "tollgate_http_request_duration_seconds_sum", { route: chat.route });
    expect(overhead).toBeGreaterThan(0);
    expect(overhead).toBeLessThan(total);
    // The stream ended, so no SSE stream is open any more.
    expect(edge.text).toMatch(/^tollgate_sse_streams_active 0$/m);
  });

  it("inference-router counts tokens, cost and upstream latency across its replicas", () => {
    const routers = byPrefix("inference-router");
    expect(routers).toHaveLength(2);
    expect(sum(routers, "tollgate_tokens_total", { model: "tollgate-mini", kind: "output" })).toBe(9);
    expect(sum(routers, "tollgate_tokens_total", { model: "tollgate-mini", kind: "input" })).toBeGreaterThan(
      0,
    );
    expect(
      sum(routers, "tollgate_cost_base_units_total", { model: "tollgate-mini", door: "account" }),
    ).toBeGreaterThan(0);
    expect(sum(routers, "tollgate_upstream_requests_total", { outcome: "ok" })).toBe(2);
    expect(sum(routers, "tollgate_upstream_latency_seconds_count", { phase: "total" })).toBe(2);
    expect(sum(routers, "tollgate_upstream_latency_seconds_count", { phase: "ttft" })).toBe(1);
    expect(sum(routers, "tollgate_usage_publish_failures_total")).toBe(0);
  });

  it("auth-policy counts Authorize outcomes by route, and the lease the served chats ran on", () => {
    const auth = scrapes["auth-policy"]!;
    // The two served chats were admitted on api-edge's lease (docs/money.md, "Leases").
    expect(sum(auth, "tollgate_leases_total", { outcome: "granted" })).toBeGreaterThanOrEqual(1);
    expect(sum(auth, "tollgate_authorize_total", { route: "chat", outcome: "ok" })).toBe(0);
    expect(sum(auth, "tollgate_authorize_total", { route: "chat", outcome: "invalid_api_key" })).toBe(1);
    expect(auth.text).toContain("# TYPE tollgate_rate_limited_total counter");
    expect(auth.text).toContain("# TYPE tollgate_reservations_total counter");
  });

  it("metering counts recorded events and cost, and reports its consumer lag", () => {
    const metering = scrapes.metering!;
    expect(sum(metering, "tollgate_usage_events_total", { outcome: "recorded" })).toBe(2);
    expect(sum(metering, "tollgate_usage_events_total", { outcome: "invalid" })).toBe(0);
    expect(sum(metering, "tollgate_metered_cost_base_units_total", { door: "account" })).toBe(
      sum(byPrefix("inference-router"), "tollgate_cost_base_units_total", { door: "account" }),
    );
    expect(metering.text).toMatch(/^tollgate_consumer_lag_messages 0$/m);
  });

  it("mpp-payment counts its operations and exposes chain call timings", () => {
    const payment = scrapes["mpp-payment"]!;
    expect(sum(payment, "tollgate_payment_operations_total", { op: "challenge", outcome: "ok" })).toBe(1);
    expect(payment.text).toContain("# TYPE tollgate_chain_rpc_duration_seconds histogram");
  });

  it("never puts a key, prompt text or request id on a metric line", () => {
    for (const [name, s] of Object.entries(scrapes)) {
      for (const secret of [stack.demoKey, WRONG_KEY, MARKER, PROMPT, ...REQUEST_IDS]) {
        expect(s.text.includes(secret), `${name} shows ${secret}`).toBe(false);
      }
    }
  });
});

describe("one merged /metrics for the all-in-one process", () => {
  const key = `tg_test_metrics_${randomBytes(8).toString("hex")}`;
  let gateway: AllInOne;
  let running: ConfiguredGateway;

  beforeAll(async () => {
    // 10 tokens a second, so the caller can cut the stream long before it ends.
    running = await startConfiguredGateway(
      (url) => `
upstreams: [{ id: fake, baseUrl: "${url}" }]
models:
  - { id: m, upstream: fake, upstreamModel: fake-small, runtime: vllm, pricing: { inputPerMillion: 1000000, outputPerMillion: 3000000 } }
accounts:
  - id: acct
    connections:
      - { id: conn, models: [m], defaultModel: m, keys: [{ id: k, secret: ${key} }] }
`,
      {
        upstream: { tokensPerSecond: 10, outputTokens: 40 },
        metricsPort: 0,
      },
    );
    ({ gateway } = running);
  });

  afterAll(async () => {
    await running?.stop();
  });

  it("serves every service's metrics once, and a stream the caller cut as 499, cancelled and closed", async () => {
    expect(gateway.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    const controller = new AbortController();
    const res = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "m",
        max_tokens: 40,
        stream: true,
        messages: [{ role: "user", content: PROMPT }],
      }),
      signal: controller.signal,
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let text = "";
    while (!text.includes('"content"')) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    // Mid-stream, the stream is open.
    expect(sum(await scrape(gateway.metricsUrl!), "tollgate_sse_streams_active")).toBe(1);
    controller.abort();
    await reader.cancel().catch(() => {});

    let m: Scrape | undefined;
    const deadline = Date.now() + 10_000;
    for (;;) {
      m = await scrape(gateway.metricsUrl!);
      if (sum(m, "tollgate_usage_events_total", { outcome: "recorded" }) >= 1) break;
      if (Date.now() > deadline) throw new Error(`the cut stream was never metered:\n${m.text}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    // One family per metric name: the merge defined nothing twice.
    const families = [...m.text.matchAll(/^# TYPE (\S+) /gm)].map((f) => f[1]);
    expect(new Set(families).size).toBe(families.length);
    expect(sum(m, "tollgate_service_info", { service: "all-in-one" })).toBe(1);
    for (const family of [
      "tollgate_http_requests_total",
      "tollgate_upstream_requests_total",
      "tollgate_authorize_total",
      "tollgate_usage_events_total",
      "tollgate_consumer_lag_messages",
    ]) {
      expect(families).toContain(family);
    }

    const chat = { route: "/v1/chat/completions", method: "POST" };
    expect(sum(m, "tollgate_http_requests_total", { ...chat, status: "499" })).toBe(1);
    expect(sum(m, "tollgate_sse_streams_active")).toBe(0);
    expect(
      sum(m, "tollgate_upstream_requests_total", {
        upstream: "fake",
        model: "fake-small",
        outcome: "cancelled",
      }),
    ).toBe(1);
    // The tokens produced before the cut are counted, as they are billed.
    const produced = sum(m, "tollgate_tokens_total", { model: "m", kind: "output" });
    expect(produced).toBeGreaterThanOrEqual(1);
    expect(produced).toBeLessThan(40);
    expect(m.text.includes(key)).toBe(false);
    expect(m.text.includes(MARKER)).toBe(false);
  });
});

describe("the metric names of the chart's queries", () => {
  const exposition = [
    "# HELP tollgate_http_requests_total Requests",
    "# TYPE tollgate_http_requests_total counter",
    'tollgate_http_requests_total{route="/v1/models",method="GET",status="200"} 1',
    "# HELP tollgate_upstream_latency_seconds Latency",
    "# TYPE tollgate_upstream_latency_seconds histogram",
  ].join("\n");

  it("finds the names a query selects, not label values", () => {
    expect(
      metricNames(
        'sum(rate(tollgate_http_requests_total{job="tollgate_fake_total"}[5m])) / histogram_quantile(0.9, tollgate_upstream_latency_seconds_bucket) and up',
      ),
    ).toEqual(["tollgate_http_requests_total", "tollgate_upstream_latency_seconds_bucket"]);
  });

  it("accepts histogram series of a registered histogram and reports a misspelt name", () => {
    const exported = exportedNames(exposition);
    const queries = [
      {
        where: "alert ok",
        expr: "histogram_quantile(0.99, rate(tollgate_upstream_latency_seconds_bucket[5m]))",
      },
      {
        where: "alert ok2",
        expr: "tollgate_upstream_latency_seconds_sum / tollgate_upstream_latency_seconds_count",
      },
      { where: "panel typo", expr: 'sum(rate(tollgate_http_request_totl{status=~"5.."}[5m]))' },
      { where: "panel wrong suffix", expr: "tollgate_http_requests_total_bucket" },
    ];
    expect(unknownNames(queries, exported)).toEqual([
      "panel typo: tollgate_http_request_totl",
      "panel wrong suffix: tollgate_http_requests_total_bucket",
    ]);
  });
});
