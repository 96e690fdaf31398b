import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { childScript, outputOf } from "./child-script.js";
import { GrpcStatus, RemoteError, StatusError } from "./grpc.js";
import {
  Counter,
  countUnaryCalls,
  createMetrics,
  errorOutcome,
  Gauge,
  type MetricsServer,
  mergeMetrics,
  serveMetrics,
} from "./metrics.js";

describe("serveMetrics", () => {
  let server: MetricsServer | undefined;

  afterEach(async () => {
    await server?.stop();
    server = undefined;
  });

  it("answers GET /metrics with the registry's text exposition and 404 elsewhere", async () => {
    const registry = createMetrics("test-service");
    const requests = new Counter({
      name: "tollgate_test_requests_total",
      help: "Requests in this test",
      labelNames: ["status"],
      registers: [registry],
    });
    requests.inc({ status: "200" }, 3);
    server = await serveMetrics(registry, "127.0.0.1", 0);
    expect(server.port).toBeGreaterThan(0);
    const base = `http://127.0.0.1:${server.port}`;

    const res = await fetch(`${base}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/plain");
    const text = await res.text();
    expect(text).toContain("# TYPE tollgate_test_requests_total counter");
    expect(text).toContain('tollgate_test_requests_total{status="200"} 3');
    // Default process metrics, prefixed, and the service it names.
    expect(text).toMatch(/^tollgate_process_cpu_user_seconds_total \d/m);
    expect(text).toContain('tollgate_service_info{service="test-service"} 1');

    expect((await fetch(`${base}/metrics?x=1`)).status).toBe(200);
    expect((await fetch(`${base}/`)).status).toBe(404);
    expect((await fetch(`${base}/metricsx`)).status).toBe(404);
    expect((await fetch(`${base}/metrics`, { method: "POST" })).status).toBe(404);
  });

  it("reads values refreshed by a collect callback on each scrape", async () => {
    const registry = createMetrics("lag", { processMetrics: false });
    let lag = 5;
    new Gauge({
      name: "tollgate_test_lag_messages",
      help: "Lag",
      registers: [registry],
      async collect() {
        this.set(await Promise.resolve(lag));
      },
    });
    server = await serveMetrics(registry, "127.0.0.1", 0);
    const scrape = () => fetch(`http://127.0.0.1:${server!.port}/metrics`).then((r) => r.text());
    expect(await scrape()).toContain("tollgate_test_lag_messages 5");
    lag = 0;
    expect(await scrape()).toContain("tollgate_test_lag_messages 0");
  });

  it("stops listening on stop(), also with a keep-alive connection open", async () => {
    server = await serveMetrics(createMetrics("s"), "127.0.0.1", 0);
    const url = `http://127.0.0.1:${server.port}/metrics`;
    expect((await fetch(url)).ok).toBe(true);
    await server.stop();
    server = undefined;
    await expect(fetch(url)).rejects.toThrow();
  });

  it("refuses a port already taken", async () => {
    server = await serveMetrics(createMetrics("a"), "127.0.0.1", 0);
    await expect(serveMetrics(createMetrics("b"), "127.0.0.1", server.port)).rejects.toThrow(/EADDRINUSE/);
  });
});

describe("mergeMetrics", () => {
  it("serves the metrics of several registries as one when only one has process metrics", async () => {
    const process = createMetrics("all-in-one");
    const a = createMetrics("a", { processMetrics: false });
    const b = createMetrics("b", { processMetrics: false });
    new Counter({ name: "tollgate_a_total", help: "a", registers: [a] }).inc();
    new Counter({ name: "tollgate_b_total", help: "b", registers: [b] }).inc(2);
    const text = await mergeMetrics([process, a, b]).metrics();
    expect(text).toContain("tollgate_a_total 1");
    expect(text).toContain("tollgate_b_total 2");
    expect(text).toContain('tollgate_service_info{service="all-in-one"} 1');
  });

  it("throws when two registries define the same metric", () => {
    expect(() => mergeMetrics([createMetrics("a"), createMetrics("b")])).toThrow(/already been registered/);
  });
});

describe("countUnaryCalls", () => {
  it("records ok and the domain code of each unary call and leaves streams alone", async () => {
    const seen: Array<[string, string]> = [];
    const handlers = countUnaryCalls(
      {
        async ok(req: { n: number }) {
          return { n: req.n + 1 };
        },
        async refuse(_req: unknown) {
          throw new StatusError(GrpcStatus.PERMISSION_DENIED, "model_not_allowed", "no");
        },
        async crash(_req: unknown) {
          throw new Error("secret detail");
        },
        async *stream(_req: unknown) {
          yield 1;
        },
      },
      (method, outcome) => seen.push([method, outcome]),
    );
    expect(await handlers.ok({ n: 1 })).toEqual({ n: 2 });
    await expect(handlers.refuse({})).rejects.toBeInstanceOf(StatusError);
    await expect(handlers.crash({})).rejects.toThrow("secret detail");
    const items: number[] = [];
    for await (const i of handlers.stream({})) items.push(i);
    expect(items).toEqual([1]);
    expect(seen).toEqual([
      ["ok", "ok"],
      ["refuse", "model_not_allowed"],
      ["crash", "internal"],
    ]);
  });
});

describe("errorOutcome", () => {
  it("uses the code of a remote failure and calls anything else internal", () => {
    expect(errorOutcome(new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_timeout", "x"))).toBe(
      "upstream_timeout",
    );
    expect(errorOutcome(new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "x"))).toBe("internal");
    expect(errorOutcome(Object.assign(new Error("x"), { code: "ECONNRESET" }))).toBe("internal");
  });
});

describe("the process metrics of createMetrics", () => {
  /** The value of one sample line of a registry's text exposition. */
  const sample = (text: string, metric: string) =>
    Number(new RegExp(`^${metric} (\\S+)$`, "m").exec(text)?.[1] ?? Number.NaN);

  it("reports the event loop's delay beyond the sampling interval: about 0 idle, a block as long as it was", async () => {
    const registry = createMetrics("t");
    await registry.metrics(); // starts a window
    await new Promise((r) => setTimeout(r, 450));
    const idle = await registry.metrics();
    expect(sample(idle, "tollgate_nodejs_eventloop_lag_p99_seconds")).toBeLessThan(0.02);
    expect(sample(idle, "tollgate_nodejs_eventloop_lag_min_seconds")).toBeLessThan(0.02);
    // Node's sampler does not record the first tick after a scrape resets it: wait for one.
    await new Promise((r) => setTimeout(r, 150));
    const end = Date.now() + 300;
    while (Date.now() < end);
    await new Promise((r) => setTimeout(r, 250));
    const blocked = await registry.metrics();
    const max = sample(blocked, "tollgate_nodejs_eventloop_lag_max_seconds");
    // The 300 ms block, less the part of it before the sampler's next tick was due (< 100 ms).
    expect(max).toBeGreaterThan(0.19);
    expect(max).toBeLessThan(0.5);
    expect(blocked.match(/^# TYPE tollgate_nodejs_eventloop_lag_max_seconds gauge$/gm)).toHaveLength(1);
  });

  it("keeps an idle process nearly asleep: its main thread wakes about 10 times a second, where sampling every 10 ms woke it about 100 times", async () => {
    // Wake-ups, not CPU time: a count the machine's load does not change (CPU time of an idle
    // process moves by milliseconds a second with whatever else runs beside it).
    const metricsModule = fileURLToPath(new URL("./metrics.ts", import.meta.url));
    const script = `import { readFileSync } from "node:fs"; import { createMetrics } from ${JSON.stringify(metricsModule)}; createMetrics("t"); const wakes = () => Number(/voluntary_ctxt_switches:\\s+(\\d+)/.exec(readFileSync("/proc/self/status", "utf8"))[1]); const sleep = (ms) => new Promise((r) => setTimeout(r, ms)); await sleep(1000); const before = wakes(); await sleep(3000); console.log(JSON.stringify((wakes() - before) / 3));`;
    const { out } = await outputOf(childScript(script));
    const wakesPerSecond = Number(out.trim());
    expect(wakesPerSecond).toBeGreaterThan(0);
    expect(wakesPerSecond).toBeLessThan(30);
  }, 20_000);
});
