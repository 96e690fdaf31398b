import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminCreate } from "./gateways.js";

/**
 * Limits that hold across replicas (docs/contract.md, "Limits"): two api-edge and two
 * inference-router processes sharing Redis and NATS, driven concurrently through both edges.
 */
describe("limits across two api-edge and two inference-router replicas", () => {
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

  const admin = (path: string, body: unknown) => adminCreate(stack, path, body);

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

  it("never lets 200 concurrent requests spend past a connection's cap, and bills exactly what was served", async () => {
    const BUDGET = 1_500n;
    await admin("/admin/v1/accounts", { id: "race" });
    await admin("/admin/v1/accounts/race/connections", {
      id: "race-conn",
      models: ["tollgate-mini"],
      budget: { amount: BUDGET.toString() },
    });
    const { secret } = (await admin("/admin/v1/accounts/race/connections/race-conn/keys", {})) as {
      secret: string;
    };

    const responses = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        fetch(`${stack.urls[i % 2]}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
          body: JSON.stringify({
            model: "tollgate-mini",
            max_tokens: 10,
            messages: [{ role: "user", content: `race ${i}` }],
          }),
        }).then(async (r) => ({
          status: r.status,
          cost: r.headers.get("x-tollgate-cost"),
          body: await r.text(),
        })),
      ),
    );
    const served = responses.filter((r) => r.status === 200);
    const refused = responses.filter((r) => r.status === 402);
    expect(served.length + refused.length).toBe(200);
    expect(served.length).toBeGreaterThan(0);
    expect(refused.length).toBeGreaterThan(0);
    for (const r of refused) expect(JSON.parse(r.body).error.code).toBe("budget_exceeded");
    const servedCost = served.reduce((sum, r) => sum + BigInt(r.cost ?? "0"), 0n);
    expect(servedCost).toBeLessThanOrEqual(BUDGET);

    // Once metering has settled every reservation, spend is exactly the served costs.
    let usage: { totals: { requests: number; cost: string } } | undefined;
    let remaining = "";
    for (let i = 0; i < 100; i++) {
      const res = await fetch(`${stack.adminUrls[0]}/admin/v1/usage?account=race`, {
        headers: { authorization: `Bearer ${stack.adminToken}` },
      });
      usage = (await res.json()) as typeof usage;
      const models = await fetch(`${stack.urls[1]}/v1/models`, {
        headers: { authorization: `Bearer ${secret}` },
      });
      remaining = models.headers.get("x-tollgate-budget-remaining") ?? "";
      if (Number(usage?.totals.requests) === served.length && remaining === (BUDGET - servedCost).toString())
        break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(Number(usage?.totals.requests)).toBe(served.length);
    expect(usage?.totals.cost).toBe(servedCost.toString());
    expect(remaining).toBe((BUDGET - servedCost).toString());
  });

  it("loses no usage while metering is down: afterwards analytics equal the served requests exactly", async () => {
    await admin("/admin/v1/accounts", { id: "outage" });
    await admin("/admin/v1/accounts/outage/connections", { id: "outage-conn", models: ["tollgate-mini"] });
    const { secret } = (await admin("/admin/v1/accounts/outage/connections/outage-conn/keys", {})) as {
      secret: string;
    };
    const send = (i: number) =>
      fetch(`${stack.urls[i % 2]}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: 4,
          stream: i % 3 === 0,
          messages: [{ role: "user", content: `o${i}` }],
        }),
      }).then(async (r) => {
        await r.text();
        return { status: r.status, cost: BigInt(r.headers.get("x-tollgate-cost") ?? "0") };
      });

    const before = await Promise.all(Array.from({ length: 10 }, (_, i) => send(i)));
    await stack.stopProcess("metering");
    const during = await Promise.all(Array.from({ length: 20 }, (_, i) => send(100 + i)));
    await stack.startProcess("metering");
    const after = await Promise.all(Array.from({ length: 10 }, (_, i) => send(200 + i)));
    const all = [...before, ...during, ...after];
    expect(all.every((r) => r.status === 200)).toBe(true);

    let totals: { requests: number; output_tokens: number } | undefined;
    for (let i = 0; i < 100; i++) {
      const res = await fetch(`${stack.adminUrls[0]}/admin/v1/usage?account=outage`, {
        headers: { authorization: `Bearer ${stack.adminToken}` },
      });
      totals = ((await res.json()) as { totals: typeof totals }).totals;
      if (Number(totals?.requests) >= all.length) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(Number(totals?.requests)).toBe(all.length);
    expect(Number(totals?.output_tokens)).toBe(all.length * 4);
  });
});
