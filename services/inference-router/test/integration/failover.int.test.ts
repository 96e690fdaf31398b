import { fromBinary } from "@bufbuild/protobuf";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { type GatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { createMetrics, type Registry } from "@tollgate/kit/metrics";
import { connectNats, drainNats, type NatsConnection } from "@tollgate/kit/nats";
import { Door, InferenceService, Operation } from "@tollgate/proto/inference";
import { natsNames } from "@tollgate/proto/subjects";
import { UsageRecordedSchema } from "@tollgate/proto/usage";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { type NatsFixture, uniqueNamespace, useNats } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { type InferenceRouter, start } from "../../src/app.js";

const log = createLogger({ service: "inference-router", level: "silent" });
const encoder = new TextEncoder();
const ns = uniqueNamespace("failover");
const names = natsNames(ns);

/**
 * Two router replicas on one real NATS: one cools a failing upstream down and the other skips
 * it from the broadcast alone, without a single failure of its own (issue 8).
 */
describe("failover and shared cooldowns across two routers", () => {
  let nats: NatsFixture;
  let nc: NatsConnection;
  let good: FakeUpstream;
  let bad: FakeUpstream;
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
    gateway = parseGatewayConfig({
      upstreams: [
        { id: "bad", baseUrl: bad.url },
        { id: "good", baseUrl: good.url },
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
      ],
      resilience: { cooldown: { failures: 2, durationMs: 60_000 } },
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
    if (nc) {
      await jetstreamManager(nc)
        .then((jsm) => jsm.streams.delete(names.usageStream))
        .catch(() => undefined);
      await drainNats(nc);
    }
    await nats?.stop();
  });

  let seq = 0;
  const complete = (client: Client<MethodsOf<typeof InferenceService>>) =>
    client.complete(
      {
        input: {
          requestId: `req_fo_${++seq}`,
          operation: Operation.CHAT,
          model: "m",
          maxOutputTokens: 3,
          body: encoder.encode(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] })),
          billing: { door: Door.PAID, accountId: "a", connectionId: "c", keyId: "k", reservationId: "r" },
        },
      },
      { timeoutMs: 15_000 },
    );

  async function gauge(registry: Registry, upstream: string): Promise<number | undefined> {
    const metric = await registry.getSingleMetric("tollgate_upstream_cooldown")?.get();
    return metric?.values.find((v) => v.labels.upstream === upstream)?.value;
  }

  it("falls back, bills the upstream that served, and shares the cooldown with the other replica", async () => {
    const [a, b] = routers as [(typeof routers)[0], (typeof routers)[0]];
    for (let i = 0; i < 2; i++) {
      const res = await complete(a.client);
      expect(res.usage?.outputTokens).toBe(3);
    }
    expect(bad.requests).toHaveLength(2);
    expect(await gauge(a.registry, "bad")).toBe(1);
    // b never called "bad" and learns of the cooldown from the broadcast alone.
    await vi.waitFor(async () => expect(await gauge(b.registry, "bad")).toBe(1), { timeout: 5_000 });
    await complete(b.client);
    expect(bad.requests).toHaveLength(2);
    expect(await gauge(b.registry, "good")).toBe(0);

    const cooldowns = await b.registry.getSingleMetric("tollgate_upstream_cooldowns_total")?.get();
    expect(cooldowns?.values.reduce((sum, v) => sum + v.value, 0) ?? 0).toBe(0);

    // Three usage events, each naming "good": the failed attempts were not billed.
    const consumer = await jetstream(nc).consumers.get(names.usageStream);
    const upstreams: string[] = [];
    for await (const m of await consumer.fetch({ max_messages: 10, expires: 1_500 })) {
      upstreams.push(fromBinary(UsageRecordedSchema, m.data).upstreamId);
      if (m.info.pending === 0) break;
    }
    expect(upstreams).toEqual(["good", "good", "good"]);
  });
});
