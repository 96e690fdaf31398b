import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryIdempotencyStore } from "../../src/adapters/memory-idempotency-store.js";
import { createRedisIdempotencyStore } from "../../src/adapters/redis-idempotency-store.js";
import { createRedisResponseItemStore } from "../../src/adapters/redis-response-item-store.js";
import type { IdempotencyStore } from "../../src/domain/idempotency.js";
import { responseItemStoreContract } from "../response-item-store-contract.js";

let fixture: RedisFixture;
let redis: Redis;
const prefix = `tollgate:${uniqueNamespace("idem")}:`;

beforeAll(async () => {
  fixture = await useRedis();
  redis = connectRedis(fixture.url);
});

afterAll(async () => {
  const keys = await redis.keys(`${prefix}*`);
  if (keys.length > 0) await redis.del(...keys);
  await quitRedis(redis);
  await fixture.stop();
});

const stores: Array<[string, () => IdempotencyStore]> = [
  ["memory", () => createMemoryIdempotencyStore()],
  ["redis", () => createRedisIdempotencyStore(redis, prefix)],
];

describe.each(stores)("idempotency store contract (%s)", (_name, make) => {
  const response = {
    status: 200,
    headers: { "content-type": "application/json" },
    body: Buffer.from([0, 1, 2, 255]),
  };

  it("lets exactly one of many concurrent duplicates run", async () => {
    const store = make();
    const id = `c-${Math.random()}`;
    const decisions = await Promise.all(Array.from({ length: 20 }, () => store.begin(id, "fp", "a", 60_000)));
    expect(decisions.filter((d) => d.kind === "run")).toHaveLength(1);
    expect(decisions.filter((d) => d.kind === "in_progress")).toHaveLength(19);
  });

  it("replays the stored response byte for byte, and refuses another body", async () => {
    const store = make();
    const id = `r-${Math.random()}`;
    expect((await store.begin(id, "fp", "a", 60_000)).kind).toBe("run");
    await store.complete(id, "fp", "a", response, 60_000);
    const again = await store.begin(id, "fp", "a", 60_000);
    expect(again).toEqual({ kind: "replay", response });
    expect((await store.begin(id, "other", "a", 60_000)).kind).toBe("conflict");
  });

  it("lets a retry run after the first attempt was abandoned", async () => {
    const store = make();
    const id = `a-${Math.random()}`;
    await store.begin(id, "fp", "a", 60_000);
    await store.abandon(id, "fp", "a");
    expect((await store.begin(id, "fp", "a", 60_000)).kind).toBe("run");
  });

  it("lets the claim lapse after its lease", async () => {
    const store = make();
    const id = `l-${Math.random()}`;
    await store.begin(id, "fp", "a", 50);
    await new Promise((r) => setTimeout(r, 120));
    expect((await store.begin(id, "fp", "a", 60_000)).kind).toBe("run");
  });

  it("keeps a renewed claim past its first lease, and never revives a finished one", async () => {
    const store = make();
    const id = `n-${Math.random()}`;
    await store.begin(id, "fp", "a", 150);
    await new Promise((r) => setTimeout(r, 100));
    await store.renew(id, "fp", "a", 150);
    await store.renew(id, "other", "a", 60_000);
    await new Promise((r) => setTimeout(r, 100));
    expect((await store.begin(id, "fp", "a", 60_000)).kind).toBe("in_progress");
    await new Promise((r) => setTimeout(r, 100));
    expect((await store.begin(id, "fp", "a", 60_000)).kind).toBe("run");
    await store.complete(id, "fp", "a", response, 60_000);
    await store.renew(id, "fp", "a", 50);
    await new Promise((r) => setTimeout(r, 100));
    expect((await store.begin(id, "fp", "a", 60_000)).kind).toBe("replay");
  });

  it("keeps a claim its request's own: the first holder of a lapsed claim never drops, renews or completes over the retry's", async () => {
    const store = make();
    const id = `o-${Math.random()}`;
    expect((await store.begin(id, "fp", "first", 50)).kind).toBe("run");
    await new Promise((r) => setTimeout(r, 120));
    // The first holder's renewals failed (its Redis away, its process stalled): a retry takes over.
    expect((await store.begin(id, "fp", "retry", 60_000)).kind).toBe("run");
    await store.renew(id, "fp", "first", 60_000);
    await store.abandon(id, "fp", "first");
    expect((await store.begin(id, "fp", "third", 60_000)).kind).toBe("in_progress");
    await store.complete(id, "fp", "first", { ...response, status: 201 }, 60_000);
    expect((await store.begin(id, "fp", "third", 60_000)).kind).toBe("in_progress");
    await store.complete(id, "fp", "retry", response, 60_000);
    expect(await store.begin(id, "fp", "third", 60_000)).toEqual({ kind: "replay", response });
    // A late answer of the first holder never replaces the stored one.
    await store.complete(id, "fp", "first", { ...response, status: 201 }, 60_000);
    expect(await store.begin(id, "fp", "third", 60_000)).toEqual({ kind: "replay", response });
  });

  it("stores a lapsed claim's answer when nobody took the claim over", async () => {
    const store = make();
    const id = `s-${Math.random()}`;
    await store.begin(id, "fp", "first", 50);
    await new Promise((r) => setTimeout(r, 120));
    await store.complete(id, "fp", "first", response, 60_000);
    expect(await store.begin(id, "fp", "retry", 60_000)).toEqual({ kind: "replay", response });
  });
});

// The Responses item store's Redis adapter, on the same server and prefix.
describe("response item store contract (redis)", () => {
  responseItemStoreContract((ttlMs) => ({
    store: createRedisResponseItemStore(redis, prefix, ttlMs),
    pass: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
  }));
});
