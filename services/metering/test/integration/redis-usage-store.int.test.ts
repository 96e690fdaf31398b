import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching } from "@tollgate/testkit/redis-keys";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisUsageStore } from "../../src/adapters/redis-usage-store.js";
import { usageEvent, usageStoreContract } from "../usage-store-contract.js";

let fixture: RedisFixture;
let redis: Redis;
const ns = uniqueNamespace("metering");
let stores = 0;

beforeAll(async () => {
  fixture = await useRedis();
  redis = connectRedis(fixture.url);
});

afterAll(async () => {
  // Only this run's keys; the server may be shared.
  await deleteMatching(redis, `${ns}:*`);
  await quitRedis(redis);
  await fixture.stop();
});

describe("redis usage store", () => {
  usageStoreContract(() => createRedisUsageStore(redis, { prefix: `${ns}:${stores++}:` }));

  it("keeps every key under its prefix and expires applied event ids", async () => {
    const prefix = `${ns}:${stores++}:`;
    const store = createRedisUsageStore(redis, { prefix, eventTtlSeconds: 60 });
    const e = usageEvent({ eventId: "evt_ttl" });
    await store.record(e);
    const keys = await redis.keys(`${prefix}*`);
    expect(keys.length).toBe(5);
    expect(keys.every((k) => k.startsWith(`${prefix}metering:`))).toBe(true);
    // The event id and the rollups share the account's hash tag; the dims sets are listed apart.
    const tagged = keys.filter((k) => k.startsWith(`${prefix}metering:{a:acct_a}:`));
    expect(tagged).toHaveLength(3);
    expect(keys.filter((k) => k.endsWith(":dims"))).toHaveLength(2);
    const ttl = await redis.ttl(`${prefix}metering:{a:acct_a}:event:evt_ttl`);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60);
  });
});

describe("redis usage store: hash tags and older rollups", () => {
  it("gives every key a script touches its account's hash tag, even for awkward account ids", async () => {
    const prefix = `${ns}:${stores++}:`;
    const store = createRedisUsageStore(redis, { prefix });
    await store.recordMany([
      usageEvent({ accountId: "}{x}", eventId: "e1" }),
      usageEvent({ accountId: "", eventId: "e2" }),
    ]);
    const keys = (await redis.keys(`${prefix}*`)).filter((k) => !k.endsWith(":dims"));
    const tags = keys.map((k) => /\{([^}]*)\}/.exec(k)?.[1]);
    expect(new Set(tags)).toEqual(new Set(["a:%7D%7Bx%7D", "a:"]));
  });

  it("still reads rollups written before the hash tags", async () => {
    const prefix = `${ns}:${stores++}:`;
    const store = createRedisUsageStore(redis, { prefix });
    const e = usageEvent({ cost: 7n });
    await store.record(e);
    // A rollup as the store wrote it before: <prefix>metering:hour:<start s>:<dims>.
    const hour = Date.parse("2025-03-10T10:00:00Z") / 1000;
    const dims = ["acct_a", "conn_a", "key_a", "small"].join("|");
    await redis.hset(`${prefix}metering:hour:${hour}:${dims}`, { requests: "2", cost: "100" });
    const r = await store.query(
      {},
      new Date("2025-03-10T00:00:00Z"),
      new Date("2025-03-11T00:00:00Z"),
      "hour",
    );
    expect(r.totals).toMatchObject({ requests: 3n, cost: 107n });
  });
});
