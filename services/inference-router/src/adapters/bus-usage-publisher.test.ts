import { fromBinary } from "@bufbuild/protobuf";
import type { EventBus } from "@tollgate/kit/bus";
import { UsageOperation, UsageRecordedSchema } from "@tollgate/proto/usage";
import { describe, expect, it } from "vitest";
import type { UsageEvent } from "../domain/ports.js";
import { createBusUsagePublisher } from "./bus-usage-publisher.js";

const EVENT: UsageEvent = {
  eventId: "evt_1",
  occurredAt: new Date("2025-03-10T12:00:00Z"),
  requestId: "req_1",
  door: "account",
  accountId: "acct_1",
  connectionId: "conn_1",
  keyId: "key_1",
  model: "small",
  runtime: "vllm",
  upstreamId: "up-1",
  tokens: { inputTokens: 5, outputTokens: 3, reasoningTokens: 0 },
  cost: 42n,
  pricingSnapshotId: "ps_1",
  reservationId: "rsv_1",
  outcome: "completed",
  streamed: true,
  operation: "chat",
};

/** A bus whose publish fails the first `failures` times, keeping every attempt. */
function flakyBus(failures: number) {
  const attempts: Array<{ subject: string; data: Uint8Array; msgId: string; at: number }> = [];
  const bus: EventBus = {
    async publish(subject, data, msgId) {
      attempts.push({ subject, data, msgId, at: Date.now() });
      if (attempts.length <= failures) throw new Error("no responders");
    },
    subscribe: () => Promise.reject(new Error("not used")),
    close: async () => {},
  };
  return { bus, attempts };
}

describe("createBusUsagePublisher", () => {
  it("publishes the operation that served the request", async () => {
    const { bus, attempts } = flakyBus(0);
    const publisher = createBusUsagePublisher(bus, "usage.subject", 5_000);
    await publisher.publish({
      ...EVENT,
      operation: "embeddings",
      tokens: { ...EVENT.tokens, outputTokens: 0 },
    });
    await publisher.publish({ ...EVENT, eventId: "evt_2" });
    const stored = attempts.map((a) => fromBinary(UsageRecordedSchema, a.data));
    expect(stored.map((s) => s.operation)).toEqual([UsageOperation.EMBEDDINGS, UsageOperation.CHAT]);
    expect(stored[0]?.outputTokens).toBe(0);
  });

  it("retries a failed publish with backoff and the same message id until it is stored", async () => {
    const { bus, attempts } = flakyBus(4);
    await createBusUsagePublisher(bus, "usage.subject", 5_000).publish(EVENT);
    expect(attempts).toHaveLength(5);
    expect(new Set(attempts.map((a) => a.msgId))).toEqual(new Set(["evt_1"]));
    // 100, 200, 400, 800 ms between attempts: together well past a short three-try budget.
    expect(attempts.at(-1)!.at - attempts[0]!.at).toBeGreaterThanOrEqual(1_400);
    const stored = fromBinary(UsageRecordedSchema, attempts.at(-1)!.data);
    expect([stored.eventId, stored.cost, stored.outputTokens]).toEqual(["evt_1", "42", 3]);
  });

  it("gives up once the deadline has passed, so the request fails with usage_not_recorded", async () => {
    const { bus, attempts } = flakyBus(Number.POSITIVE_INFINITY);
    const started = Date.now();
    await expect(createBusUsagePublisher(bus, "usage.subject", 400).publish(EVENT)).rejects.toThrow(
      "no responders",
    );
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(attempts.length).toBeGreaterThanOrEqual(2);
  });
});
