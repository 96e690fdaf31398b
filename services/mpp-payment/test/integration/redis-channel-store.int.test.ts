import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching, keysMatching } from "@tollgate/testkit/redis-keys";
import { startReplyLosingProxy } from "@tollgate/testkit/tcp-proxy";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisChannelStore } from "../../src/adapters/redis-channel-store.js";
import { channelStoreContract, newChannel } from "../channel-store-contract.js";

let fixture: RedisFixture;
let redis: Redis;
const namespaces: string[] = [];

beforeAll(async () => {
  fixture = await useRedis();
  redis = connectRedis(fixture.url);
});

afterAll(async () => {
  for (const ns of namespaces) {
    await deleteMatching(redis, `${ns}:*`);
  }
  await quitRedis(redis);
  await fixture.stop();
});

function store(opts: { reservationRetentionMs?: number } = {}) {
  const ns = uniqueNamespace("mppstore");
  namespaces.push(ns);
  return { ns, store: createRedisChannelStore(redis, { prefix: `${ns}:`, ...opts }) };
}

describe("redis channel store", () => {
  channelStoreContract(() => store().store);

  it("keeps every key of one channel under its hash tag, and lets finished reservations and used challenges expire", async () => {
    const { ns, store: s } = store({ reservationRetentionMs: 60_000 });
    const c = newChannel();
    await s.create(c);
    const now = Date.now();
    await s.reserve(c.channelId, "r1", 5n, now, now + 1_000, { id: "c1", until: now + 30_000 });
    await s.commit(c.channelId, "r1", 5n, now);
    const keys = await keysMatching(redis, `${ns}:*`);
    expect(keys.every((k) => k.includes(`{${c.channelId}}`))).toBe(true);
    const res = keys.find((k) => k.includes(":res:"))!;
    const ttl = await redis.pttl(res);
    expect(ttl).toBeGreaterThan(50_000);
    expect(ttl).toBeLessThanOrEqual(60_000);
    const used = keys.find((k) => k.includes(":used:"))!;
    expect(used.endsWith(":c1")).toBe(true);
    expect(await redis.get(used)).toBe("r1");
    const usedTtl = await redis.pttl(used);
    expect(usedTtl).toBeGreaterThan(20_000);
    expect(usedTtl).toBeLessThanOrEqual(30_000);
  });

  it("is linearizable per channel: parallel holds from many connections never exceed the voucher", async () => {
    const { ns } = store();
    const connections = Array.from({ length: 4 }, () => connectRedis(fixture.url));
    try {
      const stores = connections.map((r) => createRedisChannelStore(r, { prefix: `${ns}:` }));
      const c = newChannel(1_000_000n);
      await stores[0]!.create(c);
      const now = Date.now();
      const results = await Promise.all(
        Array.from({ length: 60 }, (_, i) =>
          stores[i % 4]!.reserve(c.channelId, `r${i}`, 30_000n, now, now + 60_000),
        ),
      );
      expect(results.filter((r) => r.kind === "reserved")).toHaveLength(33);
      expect((await stores[1]!.get(c.channelId))?.held).toBe(990_000n);
    } finally {
      await Promise.all(connections.map((r) => quitRedis(r)));
    }
  });
});

describe("redis channel store: a lost Reserve reply", () => {
  it("gives back a hold Redis took while the connection dropped, once Redis answers again", async () => {
    const ns = uniqueNamespace("mppstore");
    namespaces.push(ns);
    const proxy = await startReplyLosingProxy(fixture.url);
    const viaProxy = connectRedis(proxy.url);
    try {
      const s = createRedisChannelStore(viaProxy, { prefix: `${ns}:` });
      const direct = createRedisChannelStore(redis, { prefix: `${ns}:` });
      const c = newChannel();
      await s.create(c);
      const now = Date.now();
      expect((await s.reserve(c.channelId, "r1", 5n, now, now + 600_000)).kind).toBe("reserved");

      proxy.loseNextReply();
      await expect(s.reserve(c.channelId, "r2", 7n, now, now + 600_000)).rejects.toThrow();
      // Redis did take the second hold; the caller was told it failed (503 at the edge).
      expect((await direct.get(c.channelId))?.held).toBe(12n);
      // Once the client reconnects, the unsure hold goes back on its own (not at its expiry).
      await expect
        .poll(async () => (await direct.get(c.channelId))?.held, { timeout: 5_000, interval: 100 })
        .toBe(5n);
    } finally {
      viaProxy.disconnect();
      proxy.close();
    }
  });
});
