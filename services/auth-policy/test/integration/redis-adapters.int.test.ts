import { connectRedis, isRedisUnavailable, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching, keysMatching } from "@tollgate/testkit/redis-keys";
import { startReplyLosingProxy } from "@tollgate/testkit/tcp-proxy";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createMemoryLedger } from "../../src/adapters/memory-ledger.js";
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
    await deleteMatching(redis, `${p}*`);
  }
  await quitRedis(redis);
  await fixture.stop();
});

/** Key k1 of connection a/c, whose secret is `secret`. */
const keyRecord = (secret: string) => ({
  keyId: "k1",
  hash: hashKey(secret),
  accountId: "a",
  connectionId: "c",
  name: "",
  createdAt: new Date(),
  last4: secret.slice(-4),
});

describe("redis key store", () => {
  keyStoreContract(() => createRedisKeyStore(redis, { prefix: prefix() }));

  it("keeps keys only as hashes, under its prefix", async () => {
    const p = prefix();
    const store = createRedisKeyStore(redis, { prefix: p });
    const secret = "tg_redis_layout_secret_0123456789";
    await store.createKey(keyRecord(secret));
    const keys = await keysMatching(redis, `${p}*`);
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

describe("redis key store: a lookup racing a re-seed", () => {
  it("never answers 'no such key' for a configured key written, with the seed marker, while it looked", async () => {
    const p = prefix();
    const secret = "tg_redis_reseed_race_0123456789ab";
    const record = keyRecord(secret);
    // Another replica's re-seed writes the key, then the marker, right after this lookup's read
    // of the key came back empty (the store is emptied: no key, no marker).
    const seeder = createRedisKeyStore(redis, { prefix: p });
    let raced = false;
    const racing = new Proxy(redis, {
      get(target, name, receiver) {
        const value = Reflect.get(target, name, receiver) as unknown;
        if (name !== "multi" || typeof value !== "function") return value;
        return (...args: unknown[]) => {
          const tx = (value as (...a: unknown[]) => { exec(): Promise<unknown> }).apply(target, args);
          const exec = tx.exec.bind(tx);
          tx.exec = async () => {
            const answer = await exec();
            if (!raced) {
              raced = true;
              await seeder.importKey(record, false);
              await seeder.setConfigKeyIds(["k1"]);
            }
            return answer;
          };
          return tx;
        };
      },
    });
    const store = createRedisKeyStore(racing, { prefix: p });
    const found = await store.findByHash(record.hash).catch((err: Error) => err);
    expect(raced).toBe(true);
    // Either the key (the read saw the re-seed) or a retryable error: never a 401's "unknown".
    if (found instanceof Error) expect(isRedisUnavailable(found)).toBe(true);
    else expect(found?.keyId).toBe("k1");
  });
});

describe("redis ledger: rate limits (caller's clock)", () => {
  rateLimiterContract(() => createRedisLedger(redis, { prefix: prefix(), clock: "caller" }));
});

describe("redis ledger: rate-limit windows with totals", () => {
  const T0 = Date.UTC(2025, 5, 1, 12, 0, 0);
  const windows = (cost: number) => [
    { id: "{acct}:key:k:requests", scope: "key" as const, unit: "requests" as const, limit: 40, cost: 1 },
    {
      id: "{acct}:connection:c:tokens",
      scope: "connection" as const,
      unit: "tokens" as const,
      limit: 900,
      cost,
    },
  ];

  it("decides and counts exactly as the domain's sliding window over three minutes of uneven traffic", async () => {
    const ledger = createRedisLedger(redis, { prefix: prefix(), clock: "caller" });
    const reference = createMemoryLedger();
    let t = T0;
    let seed = 7;
    const next = () => {
      seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
      return seed / 2_147_483_648;
    };
    let admitted = 0;
    let refused = 0;
    while (t < T0 + 180_000) {
      // Bursts and pauses, so buckets leave the window while others stay.
      t += next() < 0.1 ? Math.floor(next() * 20_000) : Math.floor(next() * 900);
      const w = windows(1 + Math.floor(next() * 60));
      const [got, want] = await Promise.all([
        ledger.consume(w, new Date(t)),
        reference.consume(w, new Date(t)),
      ]);
      expect({ at: t - T0, ...got }).toEqual({ at: t - T0, ...want });
      if (got.admitted) admitted++;
      else refused++;
    }
    expect(admitted).toBeGreaterThan(50);
    expect(refused).toBeGreaterThan(20);
  });

  it("reads a busy window's totals, not its 60 buckets, while none has left the window", async () => {
    const ledger = createRedisLedger(redis, { prefix: prefix(), clock: "caller" });
    const w = [{ ...windows(1)[0]!, limit: 10_000 }];
    // One unit in each of the 60 seconds before, then 50 admissions inside one second.
    for (let i = 0; i < 60; i++) await ledger.consume(w, new Date(T0 + i * 1_000));
    await ledger.consume(w, new Date(T0 + 60_000));
    await redis.config("RESETSTAT");
    for (let i = 0; i < 50; i++) {
      expect((await ledger.consume(w, new Date(T0 + 60_000 + i))).counts[0]?.used).toBe(61 + i);
    }
    const stats = (await redis.info("commandstats")) as string;
    expect(stats).not.toMatch(/cmdstat_hgetall:/);
    expect(stats).toMatch(/cmdstat_hmget:calls=50,/);
  });
});

describe("redis ledger: settling a reservation this replica took", () => {
  const T0 = Date.UTC(2025, 5, 1, 12, 0, 0);
  const budget = (id: string) => ({
    scope: "connection" as const,
    id,
    limit: 1_000n,
    periodEndMs: T0 + 86_400_000,
  });

  it("settles in one round trip, and another replica still settles by reading the record", async () => {
    const p = prefix();
    const here = createRedisLedger(redis, { prefix: p, clock: "caller" });
    const there = createRedisLedger(redis, { prefix: p, clock: "caller" });
    const b = budget("{acct}:connection:c:day");
    const hold = (id: string) =>
      here.admit([], { hold: { reservationId: id, amount: 100n, budgets: [b] } }, new Date(T0));
    const mine = newReservationId("acct");
    const theirs = newReservationId("acct");
    expect((await hold(mine)).admitted).toBe(true);
    expect((await hold(theirs)).admitted).toBe(true);

    const hget = vi.spyOn(redis, "hget");
    try {
      expect(await here.settle(mine, 30n, "evt_1", new Date(T0 + 1_000))).toEqual({
        outcome: "settled",
        cost: 30n,
      });
      expect(hget).not.toHaveBeenCalled();
      expect(await there.settle(theirs, 40n, "evt_2", new Date(T0 + 1_000))).toEqual({
        outcome: "settled",
        cost: 40n,
      });
      expect(hget).toHaveBeenCalledTimes(1);
      // A repeat is answered from the record, as before.
      expect(await here.settle(mine, 99n, "evt_3", new Date(T0 + 2_000))).toEqual({
        outcome: "already_settled",
        cost: 30n,
      });
    } finally {
      hget.mockRestore();
    }
    const d = await there.admit([], { peek: [b] }, new Date(T0 + 3_000));
    expect(d.budgets).toEqual([{ spent: 70n, held: 0n }]);
  });
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
    const ttl = await redis.pttl(`${p}auth:rl2:{a}:key:k:requests`);
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
