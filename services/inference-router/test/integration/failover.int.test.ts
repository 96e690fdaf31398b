import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { type GatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { type Client, createClient, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { createMetrics, type Registry } from "@tollgate/kit/metrics";
import { connectNats, drainNats, type NatsConnection } from "@tollgate/kit/nats";
import { Door, InferenceService, Operation } from "@tollgate/proto/inference";
import { natsNames } from "@tollgate/proto/subjects";
import { usageEventsOf } from "@tollgate/proto/usage";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { type NatsFixture, uniqueNamespace, useNats } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { PROBE_PROMPT } from "../../src/adapters/openai-compatible/provider.js";
import { type InferenceRouter, start } from "../../src/app.js";

const log = createLogger({ service: "inference-router", level: "silent" });
const encoder = new TextEncoder();
const ns = uniqueNamespace("failover");
const names = natsNames(ns);

/** Text in a prompt that makes the "shared" upstream answer 500, as one caller's input could. */
const POISON = "poison-pill-4f1c";

/** Requests the router sent an upstream to probe it, not on a caller's behalf. */
const isProbe = (r: FakeUpstream["requests"][number]) => JSON.stringify(r.body ?? "").includes(PROBE_PROMPT);

/**
 * Two router replicas on one real NATS: one cools a failing upstream down (once its probe fails
 * too) and the other skips it from the broadcast alone, without a single failure of its own; an
 * upstream that only one caller's prompt makes fail is never cooled down for the others.
 */
describe("failover and shared cooldowns across two routers", () => {
  let nats: NatsFixture;
  let nc: NatsConnection;
  let good: FakeUpstream;
  let bad: FakeUpstream;
  let shared: FakeUpstream;
  let gateway: GatewayConfig;
  const routers: Array<{
    router: InferenceRouter;
    registry: Registry;
    client: Client<MethodsOf<typeof InferenceService>>;
  }> = [];

  beforeAll(async () => {
    nats = await useNats();
    nc = await connectNats(nats.url, "failover-int-test");
    good = await startFakeUpstream({ record: true });
    bad = await startFakeUpstream({ failure: { status: 503 }, record: true });
    shared = await startFakeUpstream({ failWhen: { text: POISON, failure: { status: 500 } }, record: true });
    gateway = parseGatewayConfig({
      upstreams: [
        { id: "bad", baseUrl: bad.url },
        { id: "good", baseUrl: good.url },
        { id: "shared", baseUrl: shared.url },
      ],
      models: [
        {
          id: "m",
          upstreams: [
            { id: "bad", priority: 0 },
            { id: "good", priority: 1 },
          ],
          upstreamModel: "fake-small",
          runtime: "vllm",
          pricing: { inputPerMillion: 1_000_000, outputPerMillion: 1_000_000 },
        },
        {
          id: "solo",
          upstream: "shared",
          upstreamModel: "fake-small",
          runtime: "vllm",
          pricing: { inputPerMillion: 1_000_000, outputPerMillion: 1_000_000 },
        },
      ],
      resilience: {
        retry: { baseBackoffMs: 10, maxBackoffMs: 50 },
        cooldown: { failures: 2, durationMs: 60_000 },
      },
    });
    for (let i = 0; i < 2; i++) {
      const registry = createMetrics("inference-router", { processMetrics: false });
      const router = await start(
        {
          grpcHost: "127.0.0.1",
          grpcPort: 0,
          gateway,
          upstreamKeys: {},
          natsUrl: nats.url,
          natsNamespace: ns,
        },
        log,
        { metrics: registry },
      );
      const client = createClient(InferenceService, `127.0.0.1:${router.port}`);
      routers.push({ router, registry, client });
    }
  });

  afterAll(async () => {
    for (const r of routers) {
      r.client.$close();
      await r.router.stop();
    }
    await good?.close();
    await bad?.close();
    await shared?.close();
    if (nc) {
      await jetstreamManager(nc)
        .then((jsm) => jsm.streams.delete(names.usageStream))
        .catch(() => undefined);
      await drainNats(nc);
    }
    await nats?.stop();
  });

  let seq = 0;
  const complete = (client: Client<MethodsOf<typeof InferenceService>>, model = "m", content = "hi") =>
    client.complete(
      {
        input: {
          requestId: `req_fo_${++seq}`,
          operation: Operation.CHAT,
          model,
          maxOutputTokens: 3,
          body: encoder.encode(JSON.stringify({ model, messages: [{ role: "user", content }] })),
          billing: { door: Door.PAID, accountId: "a", connectionId: "c", keyId: "k", reservationId: "r" },
        },
      },
      { timeoutMs: 15_000 },
    );

  async function gauge(registry: Registry, upstream: string): Promise<number | undefined> {
    const metric = await registry.getSingleMetric("tollgate_upstream_cooldown")?.get();
    return metric?.values.find((v) => v.labels.upstream === upstream)?.value;
  }

  /** A counter's value for these labels (0 when never counted). */
  async function count(registry: Registry, name: string, labels: Record<string, string>): Promise<number> {
    const metric = await registry.getSingleMetric(name)?.get();
    return (metric?.values ?? [])
      .filter((v) => Object.entries(labels).every(([k, want]) => v.labels[k] === want))
      .reduce((sum, v) => sum + v.value, 0);
  }

  it("falls back, bills the upstream that served, and shares the cooldown with the other replica", async () => {
    const [a, b] = routers as [(typeof routers)[0], (typeof routers)[0]];
    for (let i = 0; i < 2; i++) {
      const res = await complete(a.client);
      expect(res.usage?.outputTokens).toBe(3);
    }
    // Two failed attempts reach the threshold; a answers 503 to its probe too, and is cooled down.
    await vi.waitFor(async () => expect(await gauge(a.registry, "bad")).toBe(1), { timeout: 5_000 });
    expect(bad.requests.filter((r) => !isProbe(r))).toHaveLength(2);
    expect(bad.requests.filter(isProbe)).toHaveLength(1);
    expect(await count(a.registry, "tollgate_upstream_cooldown_probe_total", { upstream: "bad" })).toBe(1);
    expect(
      await count(a.registry, "tollgate_upstream_cooldown_probe_total", {
        upstream: "bad",
        result: "failed",
      }),
    ).toBe(1);
    // b never called "bad" and learns of the cooldown from the broadcast alone.
    await vi.waitFor(async () => expect(await gauge(b.registry, "bad")).toBe(1), { timeout: 5_000 });
    await complete(b.client);
    expect(bad.requests).toHaveLength(3);
    expect(await gauge(b.registry, "good")).toBe(0);

    const cooldowns = await b.registry.getSingleMetric("tollgate_upstream_cooldowns_total")?.get();
    expect(cooldowns?.values.reduce((sum, v) => sum + v.value, 0) ?? 0).toBe(0);

    // Three usage events, each naming "good": the failed attempts were not billed.
    const consumer = await jetstream(nc).consumers.get(names.usageStream);
    const upstreams: string[] = [];
    for await (const m of await consumer.fetch({ max_messages: 10, expires: 1_500 })) {
      upstreams.push(...usageEventsOf(m.subject, m.data).map((e) => e.upstreamId));
      if (m.info.pending === 0) break;
    }
    expect(upstreams).toEqual(["good", "good", "good"]);
  });

  it("does not cool an upstream down for one caller's prompts that make it answer 500: the next caller is served by it", async () => {
    const [a, b] = routers as [(typeof routers)[0], (typeof routers)[0]];
    const before = shared.requests.length;
    for (let i = 0; i < 3; i++) {
      const err = await complete(a.client, "solo", `${POISON} #${i}`).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(RemoteError);
      expect((err as RemoteError).code).toBe("upstream_error");
    }
    const poisoned = shared.requests.slice(before).filter((r) => !isProbe(r)).length;

    // Another caller right after, on the replica that saw the 500s and on the other one: served.
    for (const r of [a, b]) {
      const res = await complete(r.client, "solo", "an ordinary question");
      expect(res.usage?.outputTokens).toBe(3);
      expect(shared.requests.at(-1)!.body).toMatchObject({
        messages: [{ role: "user", content: "an ordinary question" }],
      });
    }

    // Three attempts per poisonous request, every one answered 500 (the threshold is two).
    expect(poisoned).toBe(9);
    // The upstream answered every probe, so its count started again and nothing was cooled down.
    const probes = () => shared.requests.slice(before).filter(isProbe).length;
    const probed = (result: string) =>
      count(a.registry, "tollgate_upstream_cooldown_probe_total", { upstream: "shared", result });
    await vi.waitFor(async () => expect(await probed("ok")).toBe(probes()), { timeout: 5_000 });
    expect(probes()).toBeGreaterThanOrEqual(1);
    expect(await probed("failed")).toBe(0);
    expect(await count(a.registry, "tollgate_upstream_cooldowns_total", { upstream: "shared" })).toBe(0);
    expect(await gauge(a.registry, "shared")).toBe(0);
    expect(await gauge(b.registry, "shared")).toBe(0);
  });
});
