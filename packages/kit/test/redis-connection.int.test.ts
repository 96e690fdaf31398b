import { privateRedis, type RedisFixture } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { connectRedis, quitRedis, type Redis } from "../src/redis.js";

let server: RedisFixture;
let redis: Redis;
const lines: Array<{ level: string; msg: string; fields?: object }> = [];
const log = {
  warn: (fields: object, msg: string) => lines.push({ level: "warn", msg, fields }),
  info: (msg: string) => lines.push({ level: "info", msg }),
} as unknown as Parameters<typeof connectRedis>[2];

beforeAll(async () => {
  server = await privateRedis();
  redis = connectRedis(server.url, "kit-redis-int-test", log);
  await redis.ping();
});

afterAll(async () => {
  await quitRedis(redis).catch(() => undefined);
  await server.stop();
});

describe("a Redis connection's losses", () => {
  it("are logged once when lost and once when ready again, and never printed to stderr by ioredis", async () => {
    const stderr = vi.spyOn(console, "error");
    try {
      // Down for 1.5 s: several reconnect attempts (at most 500 ms apart) fail meanwhile.
      await server.restart({ downMs: 1_500 });
      await expect
        .poll(() => lines.some((l) => l.msg === "redis connection ready again"), { timeout: 10_000 })
        .toBe(true);
      expect(await redis.ping()).toBe("PONG");
      expect(lines.map((l) => `${l.level} ${l.msg}`)).toEqual([
        "warn redis connection lost; reconnecting",
        "info redis connection ready again",
      ]);
      // The reason names the failure, not the URL.
      expect(JSON.stringify(lines[0]!.fields)).not.toContain(server.url);
      expect(stderr.mock.calls.filter((c) => String(c[0]).includes("ioredis"))).toEqual([]);
    } finally {
      stderr.mockRestore();
    }
  });
});
