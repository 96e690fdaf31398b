import { create, type MessageInitShape, toBinary } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createJetStreamBus, createMemoryBus, type EventBus } from "@tollgate/kit/bus";
import {
  createClient,
  type GrpcServer,
  GrpcStatus,
  type Handlers,
  implement,
  StatusError,
  serveGrpc,
} from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { connectNats, drainNats, type NatsConnection } from "@tollgate/kit/nats";
import { connectRedis, quitRedis } from "@tollgate/kit/redis";
import { AuthService, SettleOutcome } from "@tollgate/proto/auth";
import {
  type GetUsageRequestSchema,
  type GetUsageResponse,
  Granularity,
  MeteringService,
} from "@tollgate/proto/metering";
import { type NatsNames, natsNames } from "@tollgate/proto/subjects";
import { Door, UsageBatchSchema, UsageRecordedSchema } from "@tollgate/proto/usage";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { deleteMatching } from "@tollgate/testkit/redis-keys";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createRedisUsageStore } from "../../src/adapters/redis-usage-store.js";
import { type Metering, start } from "../../src/app.js";
import type { UsageStore } from "../../src/domain/ports.js";
import { consumeUsage } from "../../src/transport/bus/usage-consumer.js";

type EventInit = MessageInitShape<typeof UsageRecordedSchema>;

const log = createLogger({ service: "metering", level: "silent" });
const HOUR = 3_600_000;
const WAIT = { timeout: 10_000, interval: 100 };

let nats: NatsFixture;
let redis: RedisFixture;
let nc: NatsConnection;
const namespaces: string[] = [];
const running = new Set<Metering>();
const clients = new Set<{ $close(): void }>();

beforeAll(async () => {
  [nats, redis] = await Promise.all([useNats(), useRedis()]);
  nc = await connectNats(nats.url, "metering-int-test");
});

afterAll(async () => {
  for (const c of clients) c.$close();
  for (const app of running) await app.stop();
  // Remove only what this run created; the servers may be shared.
  const r = connectRedis(redis.url);
  for (const ns of namespaces) {
    await deleteMatching(r, `${ns}:*`);
    await nc.request(`$JS.API.STREAM.DELETE.${natsNames(ns).usageStream}`).catch(() => undefined);
  }
  await quitRedis(r);
  await drainNats(nc);
  await Promise.all([nats.stop(), redis.stop()]);
});

/** A fresh namespace: its own stream, subjects, durable and Redis prefix. */
function namespace(): { ns: string; names: NatsNames } {
  const ns = uniqueNamespace("metering");
  namespaces.push(ns);
  return { ns, names: natsNames(ns) };
}

async function startMetering(ns: string, logger = log, authPolicyAddr?: string): Promise<Metering> {
  const app = await start(
    {
      grpcHost: "127.0.0.1",
      grpcPort: 0,
      natsUrl: nats.url,
      natsNamespace: ns,
      redisUrl: redis.url,
      redisPrefix: `${ns}:`,
      ...(authPolicyAddr ? { authPolicyAddr } : {}),
    },
    logger,
  );
  running.add(app);
  return app;
}

async function stopMetering(app: Metering): Promise<void> {
  running.delete(app);
  await app.stop();
}

function client(port: number) {
  const c = createClient(MeteringService, `127.0.0.1:${port}`);
  clients.add(c);
  return c;
}

/** A publisher of its own, as inference-router would be. */
function publisher(names: NatsNames): Promise<EventBus> {
  return createJetStreamBus(nc, {
    name: names.usageStream,
    subjects: [names.usageSubjects],
    storage: "file",
  });
}

function publish(bus: EventBus, names: NatsNames, e: EventInit, msgId = e.requestId!): Promise<void> {
  return bus.publish(
    names.usageRecorded,
    toBinary(UsageRecordedSchema, create(UsageRecordedSchema, e)),
    msgId,
  );
}

function totalsOf(events: readonly EventInit[]) {
  return {
    requests: BigInt(events.length),
    inputTokens: events.reduce((s, e) => s + BigInt(e.inputTokens ?? 0), 0n),
    outputTokens: events.reduce((s, e) => s + BigInt(e.outputTokens ?? 0), 0n),
    reasoningTokens: events.reduce((s, e) => s + BigInt(e.reasoningTokens ?? 0), 0n),
    cost: events.reduce((s, e) => s + BigInt(e.cost ?? "0"), 0n).toString(),
  };
}

function plain(res: GetUsageResponse) {
  const t = res.totals;
  return {
    requests: t?.requests ?? 0n,
    inputTokens: t?.inputTokens ?? 0n,
    outputTokens: t?.outputTokens ?? 0n,
    reasoningTokens: t?.reasoningTokens ?? 0n,
    cost: t?.cost ?? "0",
  };
}

async function drained(app: Metering): Promise<void> {
  await vi.waitFor(async () => expect(await app.pending()).toBe(0), WAIT);
}

describe("metering against real NATS and Redis", () => {
  it("applies each usage event exactly once, across duplicates, restarts and a full replay", async () => {
    const { ns, names } = namespace();
    const now = Date.now();
    const events: EventInit[] = Array.from({ length: 12 }, (_, k) => ({
      eventId: `evt_${ns}_${k}`,
      requestId: `req_${ns}_${k}`,
      occurredAt: timestampFromDate(new Date(now - 60_000 - k * 37 * 60_000)),
      accountId: k % 3 === 0 ? "acct_1" : "acct_2",
      connectionId: `conn_${k % 2}`,
      keyId: `key_${k % 4}`,
      model: k % 2 === 0 ? "small" : "big",
      inputTokens: 100 + k,
      outputTokens: 10 * k,
      reasoningTokens: k,
      // One cost beyond 2^53 proves no float touches the sums.
      cost: k === 5 ? "9007199254740993" : String(1_000 * (k + 1)),
    }));
    const bus = await publisher(names);
    const app = await startMetering(ns);
    const metering = client(app.port);

    for (const e of events) await publish(bus, names, e);
    // Same message id: JetStream keeps one copy.
    await publish(bus, names, events[0]!);
    // New message id, same event id (a publisher retry that got a new id): metering must dedupe.
    await publish(bus, names, { ...events[3]!, requestId: `req_${ns}_retry` });

    const range = {
      from: timestampFromDate(new Date(now - 24 * HOUR)),
      to: timestampFromDate(new Date(now + HOUR)),
    };
    const expected = totalsOf(events);
    const usage = (extra: MessageInitShape<typeof GetUsageRequestSchema> = {}) =>
      metering.getUsage({ ...range, ...extra }, { timeoutMs: 2_000 });

    await vi.waitFor(async () => expect(plain(await usage())).toEqual(expected), WAIT);
    await drained(app);
    const hourly = await usage({ granularity: Granularity.HOUR });
    expect(plain(hourly)).toEqual(expected);
    const starts = hourly.buckets.map((b) => timestampDate(b.start!).getTime());
    expect(starts).toEqual([...starts].sort((a, b) => a - b));
    expect(starts.every((s) => s % HOUR === 0)).toBe(true);
    const bucketSum = hourly.buckets.reduce(
      (sum, b) => ({ requests: sum.requests + b.totals!.requests, cost: sum.cost + BigInt(b.totals!.cost) }),
      { requests: 0n, cost: 0n },
    );
    expect(bucketSum).toEqual({ requests: expected.requests, cost: BigInt(expected.cost) });
    expect(plain(await usage({ granularity: Granularity.DAY }))).toEqual(expected);
    expect(plain(await usage({ model: "big", accountId: "acct_2" }))).toEqual(
      totalsOf(events.filter((e) => e.model === "big" && e.accountId === "acct_2")),
    );

    // Restart with the same durable: everything was acked, nothing is counted again, and
    // the new consumer picks up new events.
    await stopMetering(app);
    const again = await startMetering(ns);
    const metering2 = client(again.port);
    const extra: EventInit = {
      ...events[1]!,
      eventId: `evt_${ns}_extra`,
      requestId: `req_${ns}_extra`,
      cost: "7",
    };
    await publish(bus, names, extra);
    const withExtra = totalsOf([...events, extra]);
    await vi.waitFor(
      async () => expect(plain(await metering2.getUsage(range, { timeoutMs: 2_000 }))).toEqual(withExtra),
      WAIT,
    );
    await drained(again);
    expect(plain(await metering2.getUsage(range))).toEqual(withExtra);

    // Lose the durable: the new consumer replays the whole stream and Redis dedupes all of it.
    await stopMetering(again);
    const deleted = await nc.request(`$JS.API.CONSUMER.DELETE.${names.usageStream}.${names.meteringDurable}`);
    expect(deleted.json<{ success?: boolean }>().success).toBe(true);
    const lines: Array<{ msg?: string }> = [];
    const capture = createLogger({
      service: "metering",
      level: "debug",
      destination: { write: (line: string) => void lines.push(JSON.parse(line) as { msg?: string }) },
    });
    const replayed = await startMetering(ns, capture);
    // 14 messages are stored: the 12 events, the retry with a new message id, the extra one.
    await vi.waitFor(
      () =>
        expect(lines.filter((l) => l.msg === "duplicate usage event skipped").length).toBeGreaterThanOrEqual(
          14,
        ),
      WAIT,
    );
    await drained(replayed);
    expect(lines.filter((l) => l.msg === "usage recorded")).toEqual([]);
    expect(plain(await client(replayed.port).getUsage(range))).toEqual(withExtra);
  });

  it("redelivers an event whose handler failed and still counts it once", async () => {
    const { ns, names } = namespace();
    const bus = await publisher(names);
    const r = connectRedis(redis.url);
    const inner = createRedisUsageStore(r, { prefix: `${ns}:` });
    const outcomes: string[] = [];
    const flaky: UsageStore = {
      record: (event) => inner.record(event),
      async recordMany(events) {
        const applied = await inner.recordMany(events);
        outcomes.push(...applied.map(String));
        // Applied, but the handler fails before the ack: JetStream must deliver it again.
        if (outcomes.length === 1) throw new Error("crashed before ack");
        return applied;
      },
      query: (...args) => inner.query(...args),
    };
    const sub = await consumeUsage(bus, names, flaky, log);
    try {
      const at = new Date();
      await publish(bus, names, {
        eventId: `evt_${ns}`,
        requestId: `req_${ns}`,
        occurredAt: timestampFromDate(at),
        model: "small",
        inputTokens: 3,
        cost: "11",
      });
      await vi.waitFor(() => expect(outcomes).toEqual(["recorded", "duplicate"]), WAIT);
      await vi.waitFor(async () => expect(await sub.pending()).toBe(0), WAIT);
      const day = await inner.query({}, new Date(at.getTime() - HOUR), new Date(at.getTime() + HOUR), "day");
      expect(day.totals).toEqual({
        requests: 1n,
        inputTokens: 3n,
        outputTokens: 0n,
        reasoningTokens: 0n,
        cost: 11n,
      });
    } finally {
      await sub.stop();
      await quitRedis(r);
    }
  });

  it("applies each event of a UsageBatch once: a retried batch publish is stored once, a redelivered batch counts nothing twice", async () => {
    const { ns, names } = namespace();
    const bus = await publisher(names);
    const r = connectRedis(redis.url);
    const inner = createRedisUsageStore(r, { prefix: `${ns}:` });
    const outcomes: string[] = [];
    let crash = true;
    const flaky: UsageStore = {
      record: (event) => inner.record(event),
      async recordMany(events) {
        const applied = await inner.recordMany(events);
        outcomes.push(...applied.map(String));
        // The batch's first delivery is applied, then lost before the ack: JetStream delivers it again.
        if (crash && events.length === 5) {
          crash = false;
          throw new Error("crashed before ack");
        }
        return applied;
      },
      query: (...args) => inner.query(...args),
    };
    const at = new Date();
    const events = Array.from({ length: 5 }, (_, k) =>
      create(UsageRecordedSchema, {
        eventId: `evt_${ns}_${k}`,
        requestId: `req_${ns}_${k}`,
        occurredAt: timestampFromDate(at),
        model: "small",
        inputTokens: 1 + k,
        cost: String(10 ** k),
      }),
    );
    const batch = toBinary(UsageBatchSchema, create(UsageBatchSchema, { events }));
    // A publish whose ack was lost, sent again: the same bytes under the same message id.
    await bus.publish(names.usageBatch, batch, `batch:${ns}`);
    await bus.publish(names.usageBatch, batch, `batch:${ns}`);
    const info = await nc.request(`$JS.API.STREAM.INFO.${names.usageStream}`);
    expect(info.json<{ state: { messages: number } }>().state.messages).toBe(1);
    // An older router's single event beside it.
    await publish(bus, names, {
      eventId: `evt_${ns}_single`,
      requestId: `req_${ns}_single`,
      occurredAt: timestampFromDate(at),
      model: "small",
      inputTokens: 100,
      cost: "100000",
    });
    const sub = await consumeUsage(bus, names, flaky, log);
    try {
      await vi.waitFor(async () => expect(await sub.pending()).toBe(0), WAIT);
      expect(outcomes.filter((o) => o === "recorded")).toHaveLength(6);
      expect(outcomes.filter((o) => o === "duplicate")).toHaveLength(5);
      const day = await inner.query({}, new Date(at.getTime() - HOUR), new Date(at.getTime() + HOUR), "day");
      expect(day.totals).toEqual({
        requests: 6n,
        inputTokens: 115n,
        outputTokens: 0n,
        reasoningTokens: 0n,
        cost: 111111n,
      });
    } finally {
      await sub.stop();
      await quitRedis(r);
    }
  });

  it("runs on a bus it is given, with the memory store when no Redis is set", async () => {
    const bus = createMemoryBus();
    const names = natsNames("");
    const app = await start({ grpcHost: "127.0.0.1", grpcPort: 0 }, log, { bus });
    running.add(app);
    const at = new Date();
    await publish(bus, names, {
      eventId: "evt_mem",
      requestId: "req_mem",
      occurredAt: timestampFromDate(at),
      cost: "5",
    });
    await drained(app);
    const res = await client(app.port).getUsage({});
    expect(plain(res)).toMatchObject({ requests: 1n, cost: "5" });
    await stopMetering(app);
    await bus.close();
  });

  it("refuses to start without an event bus and rejects over-wide queries", async () => {
    await expect(start({ grpcHost: "127.0.0.1", grpcPort: 0 }, log)).rejects.toThrow(/NATS_URL/);
    const app = await start({ grpcHost: "127.0.0.1", grpcPort: 0 }, log, { bus: createMemoryBus() });
    running.add(app);
    const err = await client(app.port)
      .getUsage({
        from: timestampFromDate(new Date(Date.now() - 32 * 24 * HOUR)),
        granularity: Granularity.HOUR,
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ status: 3, code: "time_range_too_large" });
    await stopMetering(app);
  });
});

/**
 * An AuthService that settles like auth-policy (idempotent by reservation id) and remembers
 * every call; its state outlives a restart, as auth-policy's Redis does.
 */
function authStub(opts: { batch?: boolean } = {}) {
  const settled = new Map<string, bigint>();
  const calls: string[] = [];
  const batches: number[] = [];
  const settleOne = (reservationId: string, actualCost: string) => {
    calls.push(reservationId);
    const before = settled.get(reservationId);
    if (before !== undefined)
      return { outcome: SettleOutcome.ALREADY_SETTLED, settledCost: before.toString() };
    settled.set(reservationId, BigInt(actualCost));
    return { outcome: SettleOutcome.SETTLED, settledCost: actualCost };
  };
  const unimplemented = async (): Promise<never> => {
    throw new StatusError(GrpcStatus.UNIMPLEMENTED, "unimplemented", "not part of this stub");
  };
  const handlers: Handlers<typeof AuthService> = {
    authorize: unimplemented,
    acquireLease: unimplemented,
    returnLease: unimplemented,
    createAccount: unimplemented,
    createConnection: unimplemented,
    createKey: unimplemented,
    listKeys: unimplemented,
    revokeKey: unimplemented,
    rotateKey: unimplemented,
    listAccounts: unimplemented,
    getAccount: unimplemented,
    updateAccount: unimplemented,
    deleteAccount: unimplemented,
    getConnection: unimplemented,
    updateConnection: unimplemented,
    deleteConnection: unimplemented,
    getKey: unimplemented,
    updateKey: unimplemented,
    settleReservation: async (req) => settleOne(req.reservationId, req.actualCost),
    async settleReservations(req) {
      // An auth-policy from before SettleReservations.
      if (opts.batch === false) return unimplemented();
      batches.push(req.items.length);
      return { results: req.items.map((i) => settleOne(i.reservationId, i.actualCost)) };
    },
  };
  let server: GrpcServer | undefined;
  return {
    settled,
    calls,
    batches,
    async start(port = 0): Promise<number> {
      server = await serveGrpc({
        host: "127.0.0.1",
        port,
        log,
        services: [
          implement(AuthService, handlers, {
            authorize: [],
            acquireLease: [],
            returnLease: [],
            settleReservation: ["metering"],
            settleReservations: ["metering"],
            createAccount: [],
            createConnection: [],
            createKey: [],
            listKeys: [],
            revokeKey: [],
            rotateKey: [],
            listAccounts: [],
            getAccount: [],
            updateAccount: [],
            deleteAccount: [],
            getConnection: [],
            updateConnection: [],
            deleteConnection: [],
            getKey: [],
            updateKey: [],
          }),
        ],
      });
      return server.port;
    },
    async stop(): Promise<void> {
      await server?.stop(0);
      server = undefined;
    },
  };
}

describe("metering settles budget reservations", () => {
  it("settles each account-door reservation once in effect: duplicates, restarts, an outage, a replay", async () => {
    const { ns, names } = namespace();
    const auth = authStub();
    const port = await auth.start();
    const addr = `127.0.0.1:${port}`;
    const bus = await publisher(names);
    const at = new Date();
    const event = (k: number, over: EventInit = {}): EventInit => ({
      eventId: `evt_${ns}_${k}`,
      requestId: `req_${ns}_${k}`,
      occurredAt: timestampFromDate(at),
      door: Door.ACCOUNT,
      accountId: "acct",
      connectionId: "main",
      keyId: "key",
      model: "small",
      inputTokens: 10 + k,
      outputTokens: k,
      cost: String(100 + 7 * k),
      reservationId: `rsv_${ns}_${k}`,
      ...over,
    });
    const expected = new Map<string, bigint>();
    const all: EventInit[] = [];
    const send = async (e: EventInit, twice = true) => {
      if (e.door === Door.ACCOUNT && e.reservationId) expected.set(e.reservationId, BigInt(e.cost!));
      all.push(e);
      await publish(bus, names, e);
      if (twice) {
        // The same message id (JetStream drops it) and a new one (metering's dedupe must).
        await publish(bus, names, e);
        await publish(bus, names, e, `${e.requestId}_again`);
      }
    };
    const usage = async (app: Metering) =>
      plain(
        await client(app.port).getUsage({
          from: timestampFromDate(new Date(at.getTime() - HOUR)),
          to: timestampFromDate(new Date(at.getTime() + HOUR)),
        }),
      );
    const settledOnce = () => {
      expect(new Map(auth.settled)).toEqual(expected);
      for (const rid of expected.keys())
        expect(auth.calls.filter((c) => c === rid).length).toBeGreaterThanOrEqual(1);
    };

    let app = await startMetering(ns, log, addr);
    for (let k = 0; k < 6; k++) await send(event(k));
    // Neither a paid-door reservation nor an event without a reservation goes to auth-policy.
    await send(event(6, { door: Door.PAID, reservationId: `res_paid_${ns}` }));
    await send(event(7, { reservationId: "" }));
    await drained(app);
    settledOnce();
    expect(auth.calls.filter((c) => c.startsWith("res_paid"))).toEqual([]);
    expect(await usage(app)).toEqual(totalsOf(all));

    // Events published while metering is stopped are settled when it is back.
    await stopMetering(app);
    await send(event(8));
    await send(event(9));
    app = await startMetering(ns, log, addr);
    await drained(app);
    settledOnce();

    // auth-policy unreachable: the event is recorded but not acknowledged until it is settled.
    await auth.stop();
    await send(event(10), false);
    await vi.waitFor(() => expect(app.pending()).resolves.toBeGreaterThan(0), WAIT);
    await new Promise((r) => setTimeout(r, 1_500));
    expect(await app.pending()).toBeGreaterThan(0);
    expect(auth.settled.has(`rsv_${ns}_10`)).toBe(false);
    await auth.start(port);
    await vi.waitFor(async () => expect(await app.pending()).toBe(0), { timeout: 30_000, interval: 200 });
    settledOnce();
    expect(await usage(app)).toEqual(totalsOf(all));

    // Lose the durable: the whole stream is replayed, and nothing is counted or settled twice.
    await stopMetering(app);
    const deleted = await nc.request(`$JS.API.CONSUMER.DELETE.${names.usageStream}.${names.meteringDurable}`);
    expect(deleted.json<{ success?: boolean }>().success).toBe(true);
    const callsBefore = auth.calls.length;
    app = await startMetering(ns, log, addr);
    await drained(app);
    expect(auth.calls.length).toBeGreaterThan(callsBefore);
    settledOnce();
    expect(await usage(app)).toEqual(totalsOf(all));
    await stopMetering(app);
    await auth.stop();
  });
});

describe("metering in batches", () => {
  const accountEvents = (ns: string, n: number): EventInit[] => {
    const at = new Date();
    return Array.from({ length: n }, (_, k) => ({
      eventId: `evt_${ns}_${k}`,
      requestId: `req_${ns}_${k}`,
      occurredAt: timestampFromDate(at),
      door: Door.ACCOUNT,
      accountId: `acct_${k % 4}`,
      connectionId: "main",
      keyId: "key",
      model: "small",
      inputTokens: 10,
      outputTokens: k,
      cost: String(1_000 + k),
      reservationId: `rsv_${ns}_${k}`,
    }));
  };
  const range = () => ({
    from: timestampFromDate(new Date(Date.now() - HOUR)),
    to: timestampFromDate(new Date(Date.now() + HOUR)),
  });

  it("settles a backlog with a few SettleReservations calls, every reservation once, rollups exact", async () => {
    const { ns, names } = namespace();
    const auth = authStub();
    const addr = `127.0.0.1:${await auth.start()}`;
    const bus = await publisher(names);
    const events = accountEvents(ns, 60);
    for (const e of events) await publish(bus, names, e);
    const app = await startMetering(ns, log, addr);
    await drained(app);
    expect(auth.batches.reduce((a, b) => a + b, 0)).toBe(60);
    expect(auth.batches.length).toBeLessThanOrEqual(3);
    expect(new Map(auth.settled)).toEqual(new Map(events.map((e) => [e.reservationId!, BigInt(e.cost!)])));
    expect(plain(await client(app.port).getUsage(range()))).toEqual(totalsOf(events));
    // Per account too: the rollups of one account live under its own hash tag.
    expect(plain(await client(app.port).getUsage({ ...range(), accountId: "acct_1" }))).toEqual(
      totalsOf(events.filter((e) => e.accountId === "acct_1")),
    );
    await stopMetering(app);
    await auth.stop();
  });

  it("settles one by one with an auth-policy that predates SettleReservations", async () => {
    const { ns, names } = namespace();
    const auth = authStub({ batch: false });
    const addr = `127.0.0.1:${await auth.start()}`;
    const bus = await publisher(names);
    const events = accountEvents(ns, 5);
    for (const e of events) await publish(bus, names, e);
    const app = await startMetering(ns, log, addr);
    await drained(app);
    expect(auth.batches).toEqual([]);
    expect(new Map(auth.settled)).toEqual(new Map(events.map((e) => [e.reservationId!, BigInt(e.cost!)])));
    expect(plain(await client(app.port).getUsage(range()))).toEqual(totalsOf(events));
    await stopMetering(app);
    await auth.stop();
  });
});
