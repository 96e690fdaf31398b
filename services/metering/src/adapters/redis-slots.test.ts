import { randomBytes, randomInt } from "node:crypto";
import { crossSlot, slotRecorder } from "@tollgate/testkit/slots";
import { describe, expect, it } from "vitest";
import { createRedisUsageStore } from "./redis-usage-store.js";

const ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-";
const randomId = () =>
  `${"abc0"[randomInt(4)]}${Array.from({ length: randomInt(0, 40) }, () => ID_CHARS[randomInt(ID_CHARS.length)]).join("")}`;

describe("metering's Redis keys on a Redis Cluster: every script and pipeline stays in one slot", () => {
  it("records a batch of events of random accounts, times and models, and queries them by hour and day", async () => {
    for (let i = 0; i < 200; i++) {
      const accounts = Array.from({ length: randomInt(1, 5) }, randomId);
      const { redis, calls } = slotRecorder((name, args) =>
        name === "meteringRecordBatch"
          ? Array.from({ length: Number(args[1]) }, () => 1)
          : name === "smembers"
            ? [`${accounts[0]}|c|k|m`]
            : {},
      );
      const store = createRedisUsageStore(redis, { prefix: `tollgate:${randomId()}:` });
      const occurredAt = new Date(Date.UTC(2026, 0, 1) + randomInt(0, 400 * 86_400) * 1_000);
      const events = Array.from({ length: randomInt(1, 20) }, (_, n) => ({
        eventId: `evt_${randomBytes(8).toString("hex")}`,
        requestId: "req",
        occurredAt: new Date(occurredAt.getTime() + n * 60_000),
        accountId: accounts[n % accounts.length]!,
        connectionId: randomId(),
        keyId: randomId(),
        model: randomId(),
        inputTokens: 1,
        outputTokens: 2,
        reasoningTokens: 0,
        cost: 3n,
      }));
      expect(await store.recordMany!(events)).toEqual(events.map(() => "recorded"));
      const from = new Date(occurredAt.getTime() - 3 * 86_400_000);
      const to = new Date(occurredAt.getTime() + 3 * 86_400_000);
      await store.query({ accountId: accounts[0]! }, from, to, "hour");
      await store.query({ accountId: accounts[0]! }, from, to, "day");
      expect(calls.filter((c) => c.name.includes("meteringRecordBatch")).length).toBe(1);
      expect(crossSlot(calls)).toEqual([]);
    }
  });
});
