import { connectRedis, quitRedis, type Redis, scanStream } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
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
  const keys: string[] = [];
  for await (const batch of scanStream(redis, { match: `${ns}:*`, count: 500 }))
    keys.push(...(batch as string[]));
  if (keys.length > 0) await redis.del(...keys);
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
    const ttl = await redis.ttl(`${prefix}metering:event:evt_ttl`);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60);
  });
});
