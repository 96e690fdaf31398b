import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * Limits that hold across replicas (issue 4): two api-edge and two inference-router processes
 * sharing Redis and NATS, driven concurrently through both edges.
 */
describe("rate limits across two api-edge replicas", () => {
  const namespace = uniqueNamespace("replicas");
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 2, edges: 2 });
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  async function admin(path: string, body: unknown): Promise<Record<string, unknown>> {
    const res = await fetch(`${stack.adminUrls[0]}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.adminToken}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(201);
    return (await res.json()) as Record<string, unknown>;
  }

  it("refuses exactly the excess of a burst split over both edges with 429", async () => {
    await admin("/admin/v1/accounts", { id: "burst" });
    await admin("/admin/v1/accounts/burst/connections", {
      id: "burst-conn",
      models: ["tollgate-mini"],
      limits: { key_requests_per_minute: 5 },
    });
    const { secret } = (await admin("/admin/v1/accounts/burst/connections/burst-conn/keys", {})) as {
      secret: string;
    };

    const burst = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        fetch(`${stack.urls[i % 2]}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
          body: JSON.stringify({
            model: "tollgate-mini",
            max_tokens: 2,
            messages: [{ role: "user", content: "hi" }],
          }),
        }),
      ),
    );
    const statuses = burst.map((r) => r.status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(5);
    expect(statuses.filter((s) => s === 429)).toHaveLength(7);
    for (const r of burst.filter((r) => r.status === 429)) {
      expect(Number(r.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe("rate_limited");
    }
    // Both edges took part in the refusals.
    expect(new Set(burst.map((r, i) => (r.status === 429 ? i % 2 : -1)).filter((e) => e >= 0)).size).toBe(2);
  });
});
