import { randomBytes } from "node:crypto";
import { crossSlot, slotRecorder } from "@tollgate/testkit/slots";
import { describe, expect, it } from "vitest";
import { createRedisIdempotencyStore } from "./redis-idempotency-store.js";
import { createRedisResponseItemStore } from "./redis-response-item-store.js";

describe("api-edge's Redis keys on a Redis Cluster: every script stays in one slot", () => {
  it("begins, completes and abandons idempotency records of random keys", async () => {
    for (let i = 0; i < 200; i++) {
      const { redis, calls } = slotRecorder(() => ["run"]);
      const store = createRedisIdempotencyStore(redis, `tollgate:t_${randomBytes(4).toString("hex")}:`);
      const id = randomBytes(16).toString("base64url");
      await store.begin(id, "fp", "a", 1_000);
      await store.complete(id, "fp", "a", { status: 200, headers: {}, body: Buffer.from("{}") }, 1_000);
      await store.abandon(id, "fp", "a");
      expect(calls.filter((c) => c.kind === "eval")).toHaveLength(3);
      expect(crossSlot(calls)).toEqual([]);
    }
  });
});

describe("api-edge's Responses items on a Redis Cluster: a read of many is one pipeline per slot", () => {
  it("puts and reads items of random ids", async () => {
    const { redis, calls } = slotRecorder(() => null);
    const store = createRedisResponseItemStore(redis, "tollgate:t:", 1_000);
    const ids = Array.from({ length: 50 }, () => `msg_${randomBytes(12).toString("hex")}`);
    for (const id of ids.slice(0, 5)) await store.put(id, { account: "a", role: "assistant", text: "t" });
    expect(await store.getMany(ids)).toEqual(ids.map(() => undefined));
    expect(crossSlot(calls)).toEqual([]);
  });
});
