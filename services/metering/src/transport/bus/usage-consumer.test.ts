import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createMemoryBus } from "@tollgate/kit/bus";
import { createLogger } from "@tollgate/kit/log";
import { natsNames } from "@tollgate/proto/subjects";
import { Door, UsageRecordedSchema } from "@tollgate/proto/usage";
import { afterEach, describe, expect, it, vi } from "vitest";
import { createMemoryUsageStore } from "../../adapters/memory-usage-store.js";
import type { ReservationSettler, SettlementOutcome, UsageStore } from "../../domain/ports.js";
import { consumeUsage } from "./usage-consumer.js";

const names = natsNames("unit");
const DAY = { from: new Date("2025-03-10T00:00:00Z"), to: new Date("2025-03-11T00:00:00Z") };

function recorded(init: MessageInitShape<typeof UsageRecordedSchema> = {}): Uint8Array {
  return toBinary(
    UsageRecordedSchema,
    create(UsageRecordedSchema, {
      eventId: "evt_1",
      requestId: "req_1",
      occurredAt: timestampFromDate(new Date("2025-03-10T10:00:00Z")),
      accountId: "acct_secretish",
      connectionId: "conn_1",
      keyId: "key_1",
      model: "small",
      inputTokens: 10,
      outputTokens: 2,
      reasoningTokens: 1,
      cost: "42",
      ...init,
    }),
  );
}

function capture() {
  const lines: Array<Record<string, unknown>> = [];
  const log = createLogger({
    service: "metering",
    level: "debug",
    destination: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) },
  });
  return { log, lines };
}

const buses: Array<ReturnType<typeof createMemoryBus>> = [];
afterEach(async () => {
  for (const bus of buses.splice(0)) await bus.close();
});

function memoryBus() {
  const bus = createMemoryBus();
  buses.push(bus);
  return bus;
}

describe("consumeUsage", () => {
  it("redelivers an event whose ack was lost and still counts it once", async () => {
    const bus = memoryBus();
    const inner = createMemoryUsageStore();
    const outcomes: string[] = [];
    const flaky: UsageStore = {
      async record(event) {
        const outcome = await inner.record(event);
        outcomes.push(outcome);
        if (outcomes.length === 1) throw new Error("connection lost before the reply");
        return outcome;
      },
      query: (...args) => inner.query(...args),
    };
    const { log } = capture();
    const sub = await consumeUsage(bus, names, flaky, log);
    await bus.publish(names.usageRecorded, recorded(), "req_1");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 50 });
    await sub.stop();

    expect(outcomes).toEqual(["recorded", "duplicate"]);
    const r = await inner.query({}, DAY.from, DAY.to, "hour");
    expect(r.totals).toEqual({
      requests: 1n,
      inputTokens: 10n,
      outputTokens: 2n,
      reasoningTokens: 1n,
      cost: 42n,
    });
  });

  it("applies a second event with the same event id as a duplicate", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const { log } = capture();
    const sub = await consumeUsage(bus, names, store, log);
    await bus.publish(names.usageRecorded, recorded(), "req_1");
    await bus.publish(names.usageRecorded, recorded({ requestId: "req_2" }), "req_2");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals.requests).toBe(1n);
  });

  it("drops an event that can never be applied and moves on", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log);
    await bus.publish(names.usageRecorded, recorded({ eventId: "bad_cost", cost: "1.5" }), "req_bad");
    await bus.publish(names.usageRecorded, new Uint8Array([0xff, 0xff, 0xff]), "req_garbage");
    await bus.publish(names.usageRecorded, recorded({ eventId: "evt_ok" }), "req_ok");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals.cost).toBe(42n);
    expect(lines.filter((l) => l["msg"] === "invalid usage event dropped")).toHaveLength(2);
  });

  it("logs one debug line per event with request id and model only", async () => {
    const bus = memoryBus();
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, createMemoryUsageStore(), log);
    await bus.publish(names.usageRecorded, recorded(), "req_1");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    const line = lines.find((l) => l["msg"] === "usage recorded");
    expect(line).toBeDefined();
    const { level, time, service, version, msg, ...fields } = line!;
    expect({ level, service, msg }).toEqual({ level: "debug", service: "metering", msg: "usage recorded" });
    expect(fields).toEqual({ requestId: "req_1", model: "small" });
    expect(JSON.stringify(lines)).not.toContain("acct_secretish");
    void time;
    void version;
  });

  it("settles an account-door reservation after recording, and only then acknowledges", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const calls: Array<[string, bigint, string]> = [];
    let failures = 1;
    const settler: ReservationSettler = {
      async settle(reservationId, cost, eventId) {
        calls.push([reservationId, cost, eventId]);
        // auth-policy unreachable once: the event must come again and be settled then.
        if (failures-- > 0) throw new Error("auth-policy unavailable");
        return calls.length === 2 ? "settled" : "already_settled";
      },
    };
    const { log } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, settler);
    const rid = "rsv_AAAAAAAAAAAAAAAAAAAA_{acct}";
    await bus.publish(names.usageRecorded, recorded({ door: Door.ACCOUNT, reservationId: rid }), "req_1");
    // The same event again under another message id (a publisher retry).
    await bus.publish(names.usageRecorded, recorded({ door: Door.ACCOUNT, reservationId: rid }), "req_1b");
    // Paid-door reservations are mpp-payment's, and an event without one has nothing to settle.
    await bus.publish(
      names.usageRecorded,
      recorded({ eventId: "evt_paid", door: Door.PAID, reservationId: "res_paid" }),
      "req_2",
    );
    await bus.publish(names.usageRecorded, recorded({ eventId: "evt_none", door: Door.ACCOUNT }), "req_3");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(calls).toEqual([
      [rid, 42n, "evt_1"],
      [rid, 42n, "evt_1"],
      [rid, 42n, "evt_1"],
    ]);
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({
      requests: 3n,
      cost: 126n,
    });
  });

  it("keeps going past a reservation auth-policy does not know, without logging the account", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const settler: ReservationSettler = { settle: async (): Promise<SettlementOutcome> => "unknown" };
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, settler);
    await bus.publish(
      names.usageRecorded,
      recorded({ door: Door.ACCOUNT, reservationId: "rsv_AAAAAAAAAAAAAAAAAAAA_{acct_secretish}" }),
      "req_1",
    );
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(lines.filter((l) => l["msg"] === "reservation unknown to auth-policy")).toHaveLength(1);
    expect(JSON.stringify(lines)).not.toContain("acct_secretish");
  });
});
