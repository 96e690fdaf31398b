import { jetstream } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { createClient } from "@tollgate/kit/grpc";
import { checkGrpcHealth } from "@tollgate/kit/health";
import { MeteringService } from "@tollgate/proto/metering";
import { natsNames } from "@tollgate/proto/subjects";
import { type UsageRecorded, usageEventsOf } from "@tollgate/proto/usage";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { expect, it } from "vitest";
import { describeAccountDoor, SECRET_PROMPT, type Target } from "./account-door.js";

const namespace = uniqueNamespace("e2e");
let nats: NatsFixture;
let redis: RedisFixture;
let stack: Stack;

async function startMultiProcessStack(): Promise<Target> {
  nats = await useNats();
  redis = await useRedis();
  stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 2 });
  return {
    url: stack.url,
    key: stack.demoKey,
    logs: () => stack.output(),
    stop: async () => {
      await stack.stop();
      await nats.stop();
      await redis.stop();
    },
  };
}

/** Reads every usage event stored in this run's JetStream stream. */
async function storedUsageEvents(): Promise<UsageRecorded[]> {
  const nc = await connect({ servers: nats.url });
  try {
    const js = jetstream(nc);
    const consumer = await js.consumers.get(natsNames(namespace).usageStream);
    const events: UsageRecorded[] = [];
    const batch = await consumer.fetch({ max_messages: 1000, expires: 1_500 });
    for await (const m of batch) {
      events.push(...usageEventsOf(m.subject, m.data));
      if (m.info.pending === 0) break;
    }
    return events;
  } finally {
    await nc.close();
  }
}

describeAccountDoor(
  "multi-process stack on real NATS and Redis (two routers)",
  startMultiProcessStack,
  (target) => {
    it("runs all five services as their own processes, each reporting SERVING over grpc.health.v1", async () => {
      const grpcServices = stack.processes.filter(
        (p) => !["api-edge", "fake-upstream", "tempo-devnet"].includes(p.name),
      );
      expect(grpcServices.map((p) => p.name.replace(/-\d+$/, "")).sort()).toEqual([
        "auth-policy",
        "inference-router",
        "inference-router",
        "metering",
        "mpp-payment",
      ]);
      for (const p of grpcServices) {
        expect(await checkGrpcHealth(`127.0.0.1:${p.port}`)).toBe("SERVING");
        expect(await checkGrpcHealth(`127.0.0.1:${p.port}`, "liveness")).toBe("SERVING");
      }
      expect((await fetch(`${target().url}/readyz`)).status).toBe(200);
    });

    it("publishes exactly one usage event per served request, streams included, and metering counts each once", async () => {
      const { url, key } = target();
      const ids = Array.from({ length: 6 }, (_, i) => `${namespace}-usage-${i}`);
      for (const [i, id] of ids.entries()) {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json", "x-request-id": id },
          body: JSON.stringify({
            model: "tollgate-mini",
            max_tokens: 3,
            stream: i % 2 === 1,
            messages: [{ role: "user", content: SECRET_PROMPT }],
          }),
        });
        expect(res.status).toBe(200);
        await res.text();
      }

      const events = (await storedUsageEvents()).filter((e) => ids.includes(e.requestId));
      expect(events.map((e) => e.requestId).sort()).toEqual([...ids].sort());
      expect(new Set(events.map((e) => e.eventId)).size).toBe(ids.length);
      for (const e of events) {
        expect(e.outputTokens).toBe(3);
        expect(e.accountId).toBe("demo");
        expect(e.keyId).toBe("demo-key");
        expect(BigInt(e.cost)).toBeGreaterThan(0n);
      }
      expect(events.filter((e) => e.streamed)).toHaveLength(3);

      // Every served request of the whole run (the scenarios above too) is counted once.
      const all = await storedUsageEvents();
      const metering = stack.processes.find((p) => p.name === "metering")!;
      const client = createClient(
        MeteringService,
        `127.0.0.1:${metering.port}`,
        stack.internalAuth("api-edge"),
      );
      try {
        const expectedCost = all.reduce((sum, e) => sum + BigInt(e.cost), 0n);
        let totals: { requests: bigint; cost: string } | undefined;
        for (let i = 0; i < 50; i++) {
          totals = (await client.getUsage({ accountId: "demo" })).totals;
          if (totals?.requests === BigInt(all.length)) break;
          await new Promise((r) => setTimeout(r, 200));
        }
        expect(totals?.requests).toBe(BigInt(all.length));
        expect(totals?.cost).toBe(expectedCost.toString());
      } finally {
        client.$close();
      }
    });
  },
);
