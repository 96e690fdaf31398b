import { create, fromBinary, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createMemoryBus } from "@tollgate/kit/bus";
import { createLogger } from "@tollgate/kit/log";
import { natsNames } from "@tollgate/proto/subjects";
import { Door, UsageBatchSchema, UsageRecordedSchema } from "@tollgate/proto/usage";
import { afterEach, describe, expect, it, vi } from "vitest";
import { createMemoryUsageStore } from "../../adapters/memory-usage-store.js";
import type {
  PaidCommitItem,
  PaidCommitOutcome,
  PaidCommitter,
  ReservationSettler,
  SettleItem,
  SettlementOutcome,
  UsageStore,
} from "../../domain/ports.js";
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

/** A UsageBatch of the given events, as a router under load publishes it. */
function batchOf(...events: Array<MessageInitShape<typeof UsageRecordedSchema>>): Uint8Array {
  return toBinary(
    UsageBatchSchema,
    create(UsageBatchSchema, {
      events: events.map((e) => fromBinary(UsageRecordedSchema, recorded(e))),
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
      record: (event) => inner.record(event),
      async recordMany(events) {
        const applied = await inner.recordMany(events);
        outcomes.push(...applied.map(String));
        if (outcomes.length === 1) throw new Error("connection lost before the reply");
        return applied;
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
      async settleMany(items) {
        return items.map(({ reservationId, cost, eventId }) => {
          calls.push([reservationId, cost, eventId]);
          // auth-policy unreachable once: the event must come again and be settled then.
          if (failures-- > 0) return new Error("auth-policy unavailable");
          return calls.length === 2 ? "settled" : "already_settled";
        });
      },
    };
    const { log } = capture();
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
    // Everything published before the consumer starts arrives as one batch.
    const sub = await consumeUsage(bus, names, store, log, undefined, { settler });
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    // Once per batch: the reservation named twice is asked once, and again after the failure.
    expect(calls).toEqual([
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
    const settler: ReservationSettler = {
      settleMany: async (items): Promise<SettlementOutcome[]> => items.map(() => "unknown"),
    };
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, { settler });
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

/**
 * A settler that settles like auth-policy (idempotent by reservation id) and remembers each
 * call; `fail` picks items to answer with an error instead, before anything is settled.
 */
function idempotentSettler(fail: (item: SettleItem, call: number) => boolean = () => false) {
  const settled = new Map<string, bigint>();
  const calls: SettleItem[][] = [];
  const settler: ReservationSettler = {
    async settleMany(items) {
      calls.push([...items]);
      return items.map((item): SettlementOutcome | Error => {
        if (fail(item, calls.length)) return new Error("store unavailable");
        if (settled.has(item.reservationId)) return "already_settled";
        settled.set(item.reservationId, item.cost);
        return "settled";
      });
    },
  };
  return { settler, settled, calls };
}

/** A memory store that counts its round trips. */
function countingStore() {
  const inner = createMemoryUsageStore();
  const batches: number[] = [];
  const store: UsageStore = {
    record: (e) => inner.record(e),
    recordMany: async (events) => {
      batches.push(events.length);
      return inner.recordMany(events);
    },
    query: (...args) => inner.query(...args),
  };
  return { store, batches };
}

const rsv = (k: number) => `rsv_${String(k).padStart(20, "A")}_{acct_${k % 3}}`;

describe("consumeUsage in batches", () => {
  it("applies a whole batch with one store round trip and one settle call, then acknowledges it", async () => {
    const bus = memoryBus();
    const { store, batches } = countingStore();
    const { settler, settled, calls } = idempotentSettler();
    for (let k = 0; k < 40; k++) {
      await bus.publish(
        names.usageRecorded,
        recorded({
          eventId: `evt_${k}`,
          requestId: `req_${k}`,
          accountId: `acct_${k % 3}`,
          door: Door.ACCOUNT,
          reservationId: rsv(k),
          cost: String(100 + k),
        }),
        `req_${k}`,
      );
    }
    const sub = await consumeUsage(bus, names, store, capture().log, undefined, { settler });
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(batches).toEqual([40]);
    expect(calls.map((c) => c.length)).toEqual([40]);
    // Told == committed == metered: every reservation settled at its event's cost, and the
    // rollups hold the same sum.
    const expected = Array.from({ length: 40 }, (_, k) => 100n + BigInt(k));
    expect([...settled.values()]).toEqual(expected);
    const metered = (await store.query({}, DAY.from, DAY.to, "day")).totals;
    expect(metered).toMatchObject({ requests: 40n, cost: expected.reduce((a, b) => a + b, 0n) });
  });

  it("drops a poison message without holding up the rest of its batch", async () => {
    const bus = memoryBus();
    const { store } = countingStore();
    const { settler, settled } = idempotentSettler();
    const { log, lines } = capture();
    await bus.publish(
      names.usageRecorded,
      recorded({ eventId: "a", door: Door.ACCOUNT, reservationId: rsv(1) }),
      "a",
    );
    await bus.publish(names.usageRecorded, new Uint8Array([0xff, 0xff, 0xff]), "garbage");
    await bus.publish(names.usageRecorded, recorded({ eventId: "", requestId: "no_id" }), "no_id");
    await bus.publish(
      names.usageRecorded,
      recorded({ eventId: "b", door: Door.ACCOUNT, reservationId: rsv(2) }),
      "b",
    );
    const sub = await consumeUsage(bus, names, store, log, undefined, { settler });
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect([...settled.keys()]).toEqual([rsv(1), rsv(2)]);
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({
      requests: 2n,
      cost: 84n,
    });
    expect(lines.filter((l) => l["msg"] === "invalid usage event dropped")).toHaveLength(2);
  });

  it("retries only the event whose settlement failed, and settles it once", async () => {
    const bus = memoryBus();
    const { store, batches } = countingStore();
    // auth-policy fails the second reservation on the first call only.
    const { settler, settled, calls } = idempotentSettler(
      (item, call) => item.reservationId === rsv(2) && call === 1,
    );
    for (let k = 1; k <= 3; k++) {
      await bus.publish(
        names.usageRecorded,
        recorded({ eventId: `evt_${k}`, door: Door.ACCOUNT, reservationId: rsv(k), cost: String(k) }),
        `req_${k}`,
      );
    }
    const sub = await consumeUsage(bus, names, store, capture().log, undefined, { settler });
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(batches).toEqual([3, 1]);
    expect(calls.map((c) => c.map((i) => i.reservationId))).toEqual([[rsv(1), rsv(2), rsv(3)], [rsv(2)]]);
    expect(settled).toEqual(
      new Map([
        [rsv(1), 1n],
        [rsv(3), 3n],
        [rsv(2), 2n],
      ]),
    );
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({ requests: 3n, cost: 6n });
  });

  it("changes nothing when a batch comes again after it was settled but not acknowledged", async () => {
    const bus = memoryBus();
    const { store } = countingStore();
    const auth = idempotentSettler();
    let crashes = 1;
    // Settles the whole batch, then dies before the acknowledgement: the batch comes again.
    const crashing: ReservationSettler = {
      async settleMany(items) {
        const results = await auth.settler.settleMany(items);
        if (crashes-- > 0) throw new Error("process died before the ack");
        return results;
      },
    };
    for (let k = 1; k <= 5; k++) {
      await bus.publish(
        names.usageRecorded,
        recorded({ eventId: `evt_${k}`, door: Door.ACCOUNT, reservationId: rsv(k), cost: String(10 * k) }),
        `req_${k}`,
      );
    }
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, { settler: crashing });
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(auth.calls).toHaveLength(2);
    expect([...auth.settled.values()]).toEqual([10n, 20n, 30n, 40n, 50n]);
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({
      requests: 5n,
      cost: 150n,
    });
    // Recorded on the first delivery (not acknowledged), found already applied on the second.
    const retried = lines.filter((l) => l["msg"] === "usage events not applied; delivered again");
    expect(retried).toHaveLength(1);
    expect(retried[0]).toMatchObject({ notRecorded: 0, notSettled: 5 });
    expect(lines.filter((l) => l["msg"] === "duplicate usage event skipped")).toHaveLength(5);
  });

  it("delivers the batch again when the store fails, acknowledging the poison message", async () => {
    const bus = memoryBus();
    const inner = createMemoryUsageStore();
    let failures = 1;
    const store: UsageStore = {
      record: (e) => inner.record(e),
      async recordMany(events) {
        if (failures-- > 0) throw new Error("redis unavailable");
        return inner.recordMany(events);
      },
      query: (...args) => inner.query(...args),
    };
    await bus.publish(names.usageRecorded, recorded({ eventId: "a" }), "a");
    await bus.publish(names.usageRecorded, new Uint8Array([0xff]), "garbage");
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log);
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect((await inner.query({}, DAY.from, DAY.to, "day")).totals.requests).toBe(1n);
    expect(lines.filter((l) => l["msg"] === "invalid usage event dropped")).toHaveLength(1);
  });

  it("applies every event of a batch once, even when the batch is delivered again after a failure", async () => {
    const bus = memoryBus();
    const inner = createMemoryUsageStore();
    const outcomes: string[] = [];
    const flaky: UsageStore = {
      record: (e) => inner.record(e),
      async recordMany(events) {
        const applied = await inner.recordMany(events);
        outcomes.push(...applied.map(String));
        // Applied, then lost before the ack: the whole batch comes again.
        if (outcomes.length === 3) throw new Error("connection lost before the reply");
        return applied;
      },
      query: (...args) => inner.query(...args),
    };
    const { log } = capture();
    const sub = await consumeUsage(bus, names, flaky, log);
    await bus.publish(
      names.usageBatch,
      batchOf({ eventId: "b1", cost: "1" }, { eventId: "b2", cost: "20" }, { eventId: "b3", cost: "300" }),
      "batch:1",
    );
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(outcomes).toEqual(["recorded", "recorded", "recorded", "duplicate", "duplicate", "duplicate"]);
    const r = await inner.query({}, DAY.from, DAY.to, "day");
    expect(r.totals).toEqual({
      requests: 3n,
      inputTokens: 30n,
      outputTokens: 6n,
      reasoningTokens: 3n,
      cost: 321n,
    });
  });

  it("meters single events from an older router beside batches, each event once", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const { log } = capture();
    const sub = await consumeUsage(bus, names, store, log);
    await bus.publish(names.usageRecorded, recorded({ eventId: "s1", cost: "5" }), "s1");
    await bus.publish(
      names.usageBatch,
      batchOf({ eventId: "b1", cost: "7" }, { eventId: "b2", cost: "11" }),
      "batch:2",
    );
    // The same event in a single message and in a batch (a router restarted between them).
    await bus.publish(names.usageRecorded, recorded({ eventId: "b2", cost: "11" }), "b2");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    const r = await store.query({}, DAY.from, DAY.to, "day");
    expect([r.totals.requests, r.totals.cost]).toEqual([3n, 23n]);
  });

  it("settles each reservation of a batch, and retries the batch until every one is settled", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const settledOnce = new Map<string, bigint>();
    let failNext = true;
    const settler: ReservationSettler = {
      async settleMany(items) {
        return items.map(({ reservationId, cost }): SettlementOutcome | Error => {
          if (reservationId === "rsv_b" && failNext) {
            failNext = false;
            return new Error("auth-policy unavailable");
          }
          if (settledOnce.has(reservationId)) return "already_settled";
          settledOnce.set(reservationId, cost);
          return "settled";
        });
      },
    };
    const { log } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, { settler });
    await bus.publish(
      names.usageBatch,
      batchOf(
        { eventId: "a", door: Door.ACCOUNT, reservationId: "rsv_a", cost: "3" },
        { eventId: "b", door: Door.ACCOUNT, reservationId: "rsv_b", cost: "4" },
      ),
      "batch:3",
    );
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(Object.fromEntries(settledOnce)).toEqual({ rsv_a: 3n, rsv_b: 4n });
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals.cost).toBe(7n);
  });

  it("drops an invalid event of a batch and applies the others", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log);
    await bus.publish(
      names.usageBatch,
      batchOf({ eventId: "ok", cost: "9" }, { eventId: "bad", cost: "1.5" }),
      "batch:4",
    );
    await bus.publish(names.usageBatch, new Uint8Array([0xff, 0xff]), "batch:garbage");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals.cost).toBe(9n);
    expect(lines.filter((l) => l["msg"] === "invalid usage event dropped")).toHaveLength(2);
  });
});

const CHANNEL = `0x${"ab".repeat(32)}`;
const hold = (k: number) => `rsv_${String(k).padStart(32, "0")}`;

/**
 * A committer that charges like mpp-payment's Commit: a held hold is charged once (the first
 * commit's cost, never above the hold), a committed one answers "committed" and changes
 * nothing, a finished one answers why. `fail` picks calls to reject as a transport failure
 * before anything is charged; `crashAfter` picks calls that charge and then lose the reply.
 */
function paymentLike(
  holds: Record<string, bigint>,
  opts: {
    fail?: (item: PaidCommitItem, call: number) => boolean;
    crashAfter?: (item: PaidCommitItem, call: number) => boolean;
    finished?: Record<string, Exclude<PaidCommitOutcome, "committed">>;
  } = {},
) {
  const charged = new Map<string, bigint>();
  const calls: PaidCommitItem[] = [];
  let inFlight = 0;
  let mostInFlight = 0;
  const committer: PaidCommitter = {
    async commit(item) {
      calls.push(item);
      const call = calls.length;
      inFlight++;
      mostInFlight = Math.max(mostInFlight, inFlight);
      try {
        await new Promise((r) => setTimeout(r, 1));
        if (opts.fail?.(item, call)) throw new Error("mpp-payment unavailable");
        const finished = opts.finished?.[item.reservationId];
        if (finished) return finished;
        const amount = holds[item.reservationId];
        if (amount === undefined) return "unknown";
        if (!charged.has(item.reservationId)) {
          charged.set(item.reservationId, item.cost < amount ? item.cost : amount);
        }
        if (opts.crashAfter?.(item, call)) throw new Error("reply lost");
        return "committed";
      } finally {
        inFlight--;
      }
    },
  };
  return { committer, charged, calls, mostInFlight: () => mostInFlight };
}

const paid = (k: number, init: MessageInitShape<typeof UsageRecordedSchema> = {}) => ({
  eventId: `evt_paid_${k}`,
  requestId: `req_paid_${k}`,
  door: Door.PAID,
  reservationId: hold(k),
  channelId: CHANNEL,
  cost: String(100 + k),
  ...init,
});

describe("consumeUsage commits paid holds", () => {
  it("commits a paid hold with its channel and the event's cost, then acknowledges", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const payment = paymentLike({ [hold(1)]: 1_000n });
    const observed: PaidCommitOutcome[] = [];
    const { log } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, {
      committer: payment.committer,
      observePaidCommit: (o) => observed.push(o),
    });
    await bus.publish(names.usageRecorded, recorded(paid(1)), "evt_paid_1");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(payment.calls).toEqual([{ reservationId: hold(1), channelId: CHANNEL, cost: 101n }]);
    expect(payment.charged).toEqual(new Map([[hold(1), 101n]]));
    expect(observed).toEqual(["committed"]);
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({
      requests: 1n,
      cost: 101n,
    });
  });

  it("charges a hold once when its event comes twice, and when a batch comes again after a lost reply", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    // The first commit of hold 2 charges it, then its reply is lost: the batch comes again.
    const payment = paymentLike(
      { [hold(1)]: 1_000n, [hold(2)]: 1_000n, [hold(3)]: 1_000n },
      { crashAfter: (item, call) => item.reservationId === hold(2) && call <= 3 },
    );
    const { log, lines } = capture();
    await bus.publish(names.usageRecorded, recorded(paid(1)), "evt_paid_1");
    // The same event under another message id (a publisher retry), and in a batch.
    await bus.publish(names.usageRecorded, recorded(paid(1)), "evt_paid_1b");
    await bus.publish(names.usageBatch, batchOf(paid(2), paid(3), paid(1)), "batch:paid");
    const sub = await consumeUsage(bus, names, store, log, undefined, { committer: payment.committer });
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    // Hold 2 is asked again after its lost reply; every call names its channel and cost.
    expect(payment.calls.filter((c) => c.reservationId === hold(2)).length).toBeGreaterThanOrEqual(2);
    expect(new Set(payment.calls.map((c) => `${c.channelId} ${c.cost}`))).toEqual(
      new Set([`${CHANNEL} 101`, `${CHANNEL} 102`, `${CHANNEL} 103`]),
    );
    // Told == committed == metered: each hold charged its event's cost once, as the rollups say.
    expect(payment.charged).toEqual(
      new Map([
        [hold(1), 101n],
        [hold(2), 102n],
        [hold(3), 103n],
      ]),
    );
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({
      requests: 3n,
      cost: 306n,
    });
    const retried = lines.filter((l) => l["msg"] === "usage events not applied; delivered again");
    expect(retried).toHaveLength(1);
    expect(retried[0]).toMatchObject({ notRecorded: 0, notSettled: 0, notCommitted: 1 });
  });

  it("acknowledges a hold api-edge committed first, charging nothing more", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const payment = paymentLike({ [hold(1)]: 1_000n });
    // api-edge's Commit after its answer landed first.
    await payment.committer.commit({ reservationId: hold(1), channelId: CHANNEL, cost: 101n });
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, { committer: payment.committer });
    await bus.publish(names.usageRecorded, recorded(paid(1)), "evt_paid_1");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(payment.calls).toHaveLength(2);
    expect(payment.charged).toEqual(new Map([[hold(1), 101n]]));
    expect(lines.filter((l) => l["level"] === "warn")).toEqual([]);
  });

  it("acknowledges holds that will never be charged, logging and counting each without its channel", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const payment = paymentLike(
      { [hold(1)]: 1_000n, [hold(2)]: 1_000n },
      { finished: { [hold(1)]: "released", [hold(2)]: "expired" } },
    );
    const observed: PaidCommitOutcome[] = [];
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, {
      committer: payment.committer,
      observePaidCommit: (o) => observed.push(o),
    });
    await bus.publish(names.usageBatch, batchOf(paid(1), paid(2), paid(3)), "batch:finished");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(payment.calls).toHaveLength(3);
    expect(observed.sort()).toEqual(["expired", "released", "unknown"]);
    const warned = lines.filter((l) => l["msg"] === "paid hold not committed from its usage event");
    expect(warned.map((l) => [l["reservationId"], l["hold"]])).toEqual([
      [hold(1), "released"],
      [hold(2), "expired"],
      [hold(3), "unknown"],
    ]);
    expect(JSON.stringify(lines)).not.toContain(CHANNEL.slice(2));
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals.requests).toBe(3n);
  });

  it("delivers an event again while its commit fails in transport, and commits it once it passes", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    // mpp-payment unreachable for the first two calls of hold 2.
    let failures = 2;
    const payment = paymentLike(
      { [hold(1)]: 1_000n, [hold(2)]: 1_000n },
      { fail: (item) => item.reservationId === hold(2) && failures-- > 0 },
    );
    const { log, lines } = capture();
    const sub = await consumeUsage(bus, names, store, log, undefined, { committer: payment.committer });
    await bus.publish(names.usageBatch, batchOf(paid(1), paid(2)), "batch:flaky");
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 10_000, interval: 20 });
    await sub.stop();
    expect(payment.charged).toEqual(
      new Map([
        [hold(1), 101n],
        [hold(2), 102n],
      ]),
    );
    expect(payment.calls.filter((c) => c.reservationId === hold(2))).toHaveLength(3);
    const retried = lines.filter((l) => l["msg"] === "usage events not applied; delivered again");
    expect(retried).toHaveLength(2);
    expect(retried[0]).toMatchObject({ notRecorded: 0, notCommitted: 1 });
    expect((await store.query({}, DAY.from, DAY.to, "day")).totals).toMatchObject({
      requests: 2n,
      cost: 203n,
    });
  });

  it("commits nothing for an account-door event, or a paid one without its channel (an older router)", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const payment = paymentLike({ [hold(1)]: 1_000n, [hold(2)]: 1_000n });
    const { settler, settled } = idempotentSettler();
    const sub = await consumeUsage(bus, names, store, capture().log, undefined, {
      settler,
      committer: payment.committer,
    });
    await bus.publish(
      names.usageBatch,
      batchOf(paid(1, { channelId: "" }), paid(2, { door: Door.ACCOUNT }), paid(3, { reservationId: "" })),
      "batch:none",
    );
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(payment.calls).toEqual([]);
    expect([...settled.keys()]).toEqual([hold(2)]);
  });

  it("commits a batch's holds a few at a time", async () => {
    const bus = memoryBus();
    const store = createMemoryUsageStore();
    const holds = Object.fromEntries(Array.from({ length: 60 }, (_, k) => [hold(k), 1_000n]));
    const payment = paymentLike(holds);
    const sub = await consumeUsage(bus, names, store, capture().log, undefined, {
      committer: payment.committer,
    });
    await bus.publish(
      names.usageBatch,
      batchOf(...Array.from({ length: 60 }, (_, k) => paid(k))),
      "batch:many",
    );
    await vi.waitFor(async () => expect(await sub.pending()).toBe(0), { timeout: 5_000, interval: 20 });
    await sub.stop();
    expect(payment.charged.size).toBe(60);
    expect(payment.mostInFlight()).toBeGreaterThan(1);
    expect(payment.mostInFlight()).toBeLessThanOrEqual(16);
  });
});
