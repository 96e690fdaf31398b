import { randomBytes, randomInt } from "node:crypto";
import { crossSlot, slotRecorder } from "@tollgate/testkit/slots";
import { describe, expect, it } from "vitest";
import { createRedisUsageStore } from "./redis-usage-store.js";

const ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-";
const randomId = () =>
  `${"abc0"[randomInt(4)]}${Array.from({ length: randomInt(0, 40) }, () => ID_CHARS[randomInt(ID_CHARS.length)]).join("")}`;

describe("metering's Redis keys on a Redis Cluster: every script and pipeline stays in one slot", () => {
  it("records events of random accounts, times and models, and queries them by hour and day", async () => {
    for (let i = 0; i < 200; i++) {
      const accountId = randomId();
      const { redis, calls } = slotRecorder((name) =>
        name === "meteringRecordUsage" ? 1 : name === "smembers" ? [`${accountId}|c|k|m`] : {},
      );
      const store = createRedisUsageStore(redis, { prefix: `tollgate:${randomId()}:` });
      const occurredAt = new Date(Date.UTC(2026, 0, 1) + randomInt(0, 400 * 86_400) * 1_000);
      await store.record({
        eventId: `evt_${randomBytes(8).toString("hex")}`,
        requestId: "req",
        occurredAt,
        accountId,
        connectionId: randomId(),
        keyId: randomId(),
        model: randomId(),
        inputTokens: 1,
        outputTokens: 2,
        reasoningTokens: 0,
        cost: 3n,
      });
      const from = new Date(occurredAt.getTime() - 3 * 86_400_000);
      const to = new Date(occurredAt.getTime() + 3 * 86_400_000);
      await store.query({ accountId }, from, to, "hour");
      await store.query({ accountId }, from, to, "day");
      const script = calls.find((c) => c.kind === "script");
      expect(script?.keys).toHaveLength(5);
      expect(calls.filter((c) => c.kind === "pipeline").length).toBe(4);
      expect(crossSlot(calls)).toEqual([]);
    }
  });
});
