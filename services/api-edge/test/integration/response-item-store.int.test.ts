import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe } from "vitest";
import { createRedisResponseItemStore } from "../../src/adapters/redis-response-item-store.js";
import { responseItemStoreContract } from "../response-item-store-contract.js";

let fixture: RedisFixture;
let redis: Redis;
const prefix = `tollgate:${uniqueNamespace("items")}:`;

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

describe("response item store contract (redis)", () => {
  responseItemStoreContract((ttlMs) => ({
    store: createRedisResponseItemStore(redis, prefix, ttlMs),
    pass: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
  }));
});
