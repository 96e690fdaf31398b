import { connectRedis, quitRedis, type Redis, scanStream } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { startReplyLosingProxy } from "@tollgate/testkit/tcp-proxy";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisKeyStore } from "../../src/adapters/redis-key-store.js";
import { createRedisLedger } from "../../src/adapters/redis-ledger.js";
import { newReservationId } from "../../src/domain/budget.js";
import { hashKey } from "../../src/domain/keys.js";
import { keyStoreContract } from "../key-store-contract.js";
import { ledgerContract } from "../ledger-contract.js";
import { rateLimiterContract } from "../rate-limiter-contract.js";

let fixture: RedisFixture;
let redis: Redis;
const prefixes: string[] = [];

/** A prefix no other test (or test run on a shared server) uses. */
function prefix(): string {
  const p = `${uniqueNamespace("auth")}:`;
  prefixes.push(p);
  return p;
}

beforeAll(async () => {
  fixture = await useRedis();
  redis = connectRedis(fixture.url);
});

afterAll(async () => {
  for (const p of prefixes) {
    const keys: string[] = [];
    for await (const batch of scanStream(redis, { match: `${p}*`, count: 500 }))
      keys.push(...(batch as string[]));
    if (keys.length > 0) await redis.del(...keys);
  }
  await quitRedis(redis);
  await fixture.stop();
});

describe("redis key store", () => {
  keyStoreContract(() => createRedisKeyStore(redis, { prefix: prefix() }));

  it("keeps keys only as hashes, under its prefix", async () => {
    const p = prefix();
    const store = createRedisKeyStore(redis, { prefix: p });
    const secret = "tg_redis_layout_secret_0123456789";
    await store.createKey({
      keyId: "k1",
      hash: hashKey(secret),
      accountId: "a",
      connectionId: "c",
      name: "",
      createdAt: new Date(),
      last4: secret.slice(-4),
    });
    const keys: string[] = [];
    for await (const batch of scanStream(redis, { match: `${p}*`, count: 100 }))
      keys.push(...(batch as string[]));
    expect(keys.sort()).toEqual(
      [`${p}auth:key:${hashKey(secret).toString("hex")}`, `${p}auth:key-id:k1`, `${p}auth:keys:a/c`].sort(),
    );
    for (const k of keys) {
      const type = await redis.type(k);
      const dump =
        type === "hash"
          ? JSON.stringify(await redis.hgetall(k))
          : type === "zset"
            ? JSON.stringify(await redis.zrange(k, "0", "-1"))
            : String(await redis.get(k));
      expect(dump).not.toContain(secret.slice(3));
    }
  });
});

describe("redis ledger: rate limits (caller's clock)", () => {
  rateLimiterContract(() => createRedisLedger(redis, { prefix: prefix(), clock: "caller" }));
});

describe("redis ledger: budgets (caller's clock)", () => {
  ledgerContract((opts) => createRedisLedger(redis, { ...opts, prefix: prefix(), clock: "caller" }));
});

describe("redis ledger (Redis clock)", () => {
  it("counts on the Redis server's clock and lets its counters expire", async () => {
    const p = prefix();
    const limiter = createRedisLedger(redis, { prefix: p });
    const w = [
      { id: "{a}:key:k:requests", scope: "key" as const, unit: "requests" as const, limit: 2, cost: 1 },
    ];
    // A caller clock far in the past is ignored: the server's clock decides.
    const first = await limiter.consume(w, new Date(0));
    const [sec] = await redis.time();
    expect(Math.abs(first.nowMs - Number(sec) * 1_000)).toBeLessThan(2_000);
    await limiter.consume(w, new Date(0));
    const refused = await limiter.consume(w, new Date(0));
    expect(refused.admitted).toBe(false);
    expect(refused.counts[0]?.retryAfterMs).toBeGreaterThan(59_000);
    expect(refused.counts[0]?.retryAfterMs).toBeLessThanOrEqual(61_000);
    const ttl = await redis.pttl(`${p}auth:rl:{a}:key:k:requests`);
    expect(ttl).toBeGreaterThan(60_000);
    expect(ttl).toBeLessThanOrEqual(63_000);
  });
});

describe("redis ledger: a lost admission reply", () => {
  it("gives back a hold Redis took while the connection dropped, once Redis answers again", async () => {
    const p = prefix();
    const proxy = await startReplyLosingProxy(fixture.url);
    const viaProxy = connectRedis(proxy.url);
    try {
      const ledger = createRedisLedger(viaProxy, { prefix: p });
      const budget = {
        id: "{acct}:connection:c:month:2026-11",
        scope: "connection" as const,
        limit: 1_000n,
        periodEndMs: Date.now() + 86_400_000,
      };
      const hold = (reservationId: string) =>
        ledger.admit([], { hold: { reservationId, amount: 28n, budgets: [budget] } }, new Date());
      // A first admission loads the script on this connection.
      expect((await hold(newReservationId("acct"))).budgetsAdmitted).toBe(true);
      const held = async () => BigInt((await redis.hget(`${p}auth:budget:${budget.id}`, "held")) ?? "0");
      expect(await held()).toBe(28n);

      proxy.loseNextReply();
      await expect(hold(newReservationId("acct"))).rejects.toThrow();
      // Redis did take the second hold; the caller was told it failed (503 at the edge).
      expect(await held()).toBe(56n);
      // Once the client reconnects, the unsure hold goes back on its own (not at its TTL).
      await expect.poll(held, { timeout: 5_000, interval: 100 }).toBe(28n);
    } finally {
      viaProxy.disconnect();
      proxy.close();
    }
  });
});
