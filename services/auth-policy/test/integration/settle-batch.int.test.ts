import { parseGatewayConfig } from "@tollgate/config";
import { createClient, GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { createMetrics } from "@tollgate/kit/metrics";
import { connectRedis, isCluster, quitRedis, type Redis } from "@tollgate/kit/redis";
import { AuthService, BudgetPeriod, Route, SettleOutcome } from "@tollgate/proto/auth";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching } from "@tollgate/testkit/redis-keys";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisLedger } from "../../src/adapters/redis-ledger.js";
import { start } from "../../src/app.js";
import { newReservationId, settleReservations } from "../../src/domain/budget.js";
import { settleBatchContract } from "../settle-batch-contract.js";
import { chatAsk, PRICED_MODEL } from "./priced.js";

let fixture: RedisFixture;
let redis: Redis;
const prefixes: string[] = [];

function prefix(): string {
  const p = `${uniqueNamespace("auth")}:`;
  prefixes.push(p);
  return p;
}

beforeAll(async () => {
  fixture = await useRedis();
  redis = connectRedis(fixture.url);
});

afterAll(async () => {
  for (const p of prefixes) {
    await deleteMatching(redis, `${p}*`);
  }
  await quitRedis(redis);
  await fixture.stop();
});

/** A connection's monthly budget of 1,000 in account "acct", its period ending in a day. */
function monthBudget(name: string, now: Date) {
  return {
    id: `{acct}:connection:c:month:${name}`,
    scope: "connection" as const,
    limit: 1_000n,
    periodEndMs: now.getTime() + 86_400_000,
  };
}

/** The commands sent to Redis until stop() (MONITOR): those a script runs are left out. */
async function watchCommands(): Promise<{ sent: string[]; stop: () => Promise<void> }> {
  if (isCluster(redis)) throw new Error("this test watches one Redis server");
  const sent: string[] = [];
  const monitor = await redis.monitor();
  monitor.on("monitor", (_time: string, args: string[], source: string) => {
    if (!source.includes("lua")) sent.push(String(args[0]).toLowerCase());
  });
  return {
    sent,
    stop: async () => {
      await new Promise((r) => setTimeout(r, 100));
      monitor.disconnect();
    },
  };
}

describe("redis ledger: batch settlement", () => {
  settleBatchContract((opts) => createRedisLedger(redis, { ...opts, prefix: prefix(), clock: "caller" }));

  it("reads every record in one pipeline and settles in another, and one item's failure leaves the others settled", async () => {
    const p = prefix();
    const ledger = createRedisLedger(redis, { prefix: p });
    expect(ledger.settleMany).toBeTypeOf("function");
    const now = new Date();
    const b = monthBudget("x", now);
    const ids = [newReservationId("acct"), newReservationId("acct")];
    for (const reservationId of ids) {
      await ledger.admit([], { hold: { reservationId, amount: 100n, budgets: [b] } }, now);
    }
    // A record Redis cannot read as a hash: its item fails, alone.
    const broken = newReservationId("acct");
    await redis.set(`${p}auth:reservation:${broken}`, "not a hash");
    const { sent, stop } = await watchCommands();
    const results = await settleReservations(ledger, [
      { reservationId: ids[0]!, cost: 40n, eventId: "e0" },
      { reservationId: broken, cost: 1n, eventId: "eb" },
      { reservationId: ids[1]!, cost: 60n, eventId: "e1" },
    ]);
    await stop();
    expect(results[0]).toEqual({ outcome: "settled", cost: 40n });
    expect(results[1]).toBeInstanceOf(Error);
    expect(results[2]).toEqual({ outcome: "settled", cost: 60n });
    // Three reads, then two settlement scripts (the broken record is not settled).
    expect(sent.filter((c) => c === "hget")).toHaveLength(3);
    expect(sent.filter((c) => c === "evalsha" || c === "eval")).toHaveLength(2);
    const peek = await ledger.admit([], { peek: [b] }, now);
    expect(peek.budgets[0]).toEqual({ spent: 100n, held: 0n });
  });
});

describe("redis ledger: batch settlement reads a record once", () => {
  it("reads a record its items share once: a redelivered event settles nothing more", async () => {
    const p = prefix();
    const ledger = createRedisLedger(redis, { prefix: p });
    const now = new Date();
    const b = monthBudget("y", now);
    const id = newReservationId("acct");
    await ledger.admit([], { hold: { reservationId: id, amount: 100n, budgets: [b] } }, now);
    const { sent, stop } = await watchCommands();
    const results = await settleReservations(ledger, [
      { reservationId: id, cost: 40n, eventId: "e0" },
      { reservationId: id, cost: 40n, eventId: "e0" },
      { reservationId: id, cost: 40n, eventId: "e0" },
    ]);
    await stop();
    expect(results.map((r) => (r instanceof Error ? r.message : r.outcome))).toEqual([
      "settled",
      "already_settled",
      "already_settled",
    ]);
    expect(sent.filter((c) => c === "hget")).toHaveLength(1);
    expect(sent.filter((c) => c === "evalsha" || c === "eval")).toHaveLength(1);
    const peek = await ledger.admit([], { peek: [b] }, now);
    expect(peek.budgets[0]).toEqual({ spent: 40n, held: 0n });
  });

  it("settles a batch's tickets of one lease in a script call per 64, each charged once", async () => {
    const p = prefix();
    const ledger = createRedisLedger(redis, { prefix: p });
    const now = new Date();
    const b = { ...monthBudget("z", now), limit: 100_000n };
    const lease = newReservationId("acct");
    const amount = 20_000n;
    const granted = await ledger.admit(
      [],
      { hold: { reservationId: lease, amount, budgets: [b], lease: true } },
      now,
    );
    expect(granted.admitted).toBe(true);
    const tickets = (n: number) =>
      Array.from({ length: n }, (_, i) => ({
        reservationId: `${lease}~${i + 1}`,
        cost: BigInt(i + 1),
        eventId: `evt_${i + 1}`,
      }));
    const watch = async (items: ReturnType<typeof tickets>) => {
      const { sent, stop } = await watchCommands();
      const results = await settleReservations(ledger, items);
      await stop();
      return {
        results,
        hget: sent.filter((c) => c === "hget").length,
        scripts: sent.filter((c) => c === "evalsha" || c === "eval").length,
      };
    };
    // 40 tickets and a repeat of the first: one read of the lease's record and one script call
    // (41 calls before this batching).
    const first = await watch([...tickets(40), tickets(1)[0]!]);
    expect(first.results.slice(0, 40)).toEqual(
      tickets(40).map((t) => ({ outcome: "settled", cost: t.cost })),
    );
    expect(first.results[40]).toEqual({ outcome: "already_settled", cost: 1n });
    expect([first.hget, first.scripts]).toEqual([1, 1]);
    // 150 tickets, the first 40 again: three calls (64, 64, 22), each ticket charged once.
    const second = await watch(tickets(150));
    expect(
      second.results.slice(0, 40).every((r) => !(r instanceof Error) && r.outcome === "already_settled"),
    ).toBe(true);
    expect(second.results.slice(40)).toEqual(
      tickets(150)
        .slice(40)
        .map((t) => ({ outcome: "settled", cost: t.cost })),
    );
    expect([second.hget, second.scripts]).toEqual([1, 3]);
    // Charged exactly once each: 1 + 2 + … + 150, out of the lease's hold.
    const charged = (150n * 151n) / 2n;
    const peek = await ledger.admit([], { peek: [b] }, now);
    expect(peek.budgets[0]).toEqual({ spent: charged, held: amount - charged });
  });
});

/** auth-policy over gRPC on its own prefix, with one model priced 1 base unit per token. */
function startPriced(metrics?: ReturnType<typeof createMetrics>) {
  const gateway = parseGatewayConfig({
    upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:1/v1" }],
    models: [PRICED_MODEL],
  });
  const log = createLogger({ service: "auth-policy", level: "silent" });
  return start(
    { grpcHost: "127.0.0.1", grpcPort: 0, gateway, redisUrl: fixture.url, redisPrefix: prefix() },
    log,
    ...(metrics ? [{ metrics }] : []),
  );
}

describe("SettleReservations over gRPC", () => {
  it("settles a batch with a result per item: a bad amount fails alone, a repeat changes nothing", async () => {
    const app = await startPriced();
    const auth = createClient(AuthService, `127.0.0.1:${app.port}`);
    try {
      const BUDGET = 1_000n;
      await auth.createAccount({ accountId: "batch" });
      await auth.createConnection({
        accountId: "batch",
        connectionId: "main",
        models: ["priced"],
        budget: { amount: BUDGET.toString() },
      });
      const { secret } = await auth.createKey({ accountId: "batch", connectionId: "main" });
      // Quoted 200 each: 100 bytes + 8 × 1 message + 16 + 76 output tokens.
      const ask = chatAsk(secret);
      const [a, b, c] = [await auth.authorize(ask), await auth.authorize(ask), await auth.authorize(ask)];
      expect(BigInt(c!.budgetRemaining)).toBe(BUDGET - 600n);
      const batch = {
        items: [
          { reservationId: a!.reservationId, actualCost: "150", eventId: "evt_a" },
          { reservationId: b!.reservationId, actualCost: "1.5", eventId: "evt_b" },
          { reservationId: c!.reservationId, actualCost: "90", eventId: "evt_c" },
          { reservationId: a!.reservationId, actualCost: "150", eventId: "evt_a" },
          { reservationId: "rsv_AAAAAAAAAAAAAAAAAAAA_{nobody}", actualCost: "5", eventId: "evt_x" },
        ],
      };
      const first = await auth.settleReservations(batch);
      expect(first.results.map((r) => [r.outcome, r.settledCost, r.errorCode])).toEqual([
        [SettleOutcome.SETTLED, "150", ""],
        [SettleOutcome.UNSPECIFIED, "", "invalid_argument"],
        [SettleOutcome.SETTLED, "90", ""],
        [SettleOutcome.ALREADY_SETTLED, "150", ""],
        [SettleOutcome.UNKNOWN_RESERVATION, "", ""],
      ]);
      // The same batch again (a redelivery): nothing moves; b, still held, settles when fixed.
      const again = await auth.settleReservations({
        items: batch.items.map((i) => (i.actualCost === "1.5" ? { ...i, actualCost: "20" } : i)),
      });
      expect(again.results.map((r) => r.outcome)).toEqual([
        SettleOutcome.ALREADY_SETTLED,
        SettleOutcome.SETTLED,
        SettleOutcome.ALREADY_SETTLED,
        SettleOutcome.ALREADY_SETTLED,
        SettleOutcome.UNKNOWN_RESERVATION,
      ]);
      // Told == committed: the budget is down by exactly the settled costs, nothing held.
      const shown = await auth.authorize({ key: secret, route: Route.MODELS });
      expect(BigInt(shown.budgetRemaining)).toBe(BUDGET - 150n - 20n - 90n);
      const tooMany = await auth
        .settleReservations({
          items: Array.from({ length: 1_001 }, () => ({ reservationId: "r", actualCost: "1", eventId: "e" })),
        })
        .catch((e: unknown) => e);
      expect(tooMany).toBeInstanceOf(RemoteError);
      expect(tooMany).toMatchObject({ status: GrpcStatus.INVALID_ARGUMENT, code: "invalid_argument" });
    } finally {
      auth.$close();
      await app.stop();
    }
  });
  it("caps the settlement of forged tickets of a live lease at its allowance, and counts them", async () => {
    const metrics = createMetrics("auth-policy");
    const app = await startPriced(metrics);
    const auth = createClient(AuthService, `127.0.0.1:${app.port}`);
    try {
      const BUDGET = 1_000_000n;
      await auth.createAccount({ accountId: "vic1" });
      await auth.createConnection({
        accountId: "vic1",
        connectionId: "main",
        models: ["priced"],
        budget: { amount: BUDGET.toString(), period: BudgetPeriod.DAY },
      });
      const { secret } = await auth.createKey({ accountId: "vic1", connectionId: "main" });
      // Quoted 200 each: 100 bytes + 8 × 1 message + 16 + 76 output tokens; 8 of them leased.
      const ask = chatAsk(secret);
      const lease = await auth.acquireLease({ request: ask, requests: 8 });
      expect(lease).toMatchObject({ granted: true, budget: "1600" });
      const usage = async () =>
        (await auth.getConnection({ accountId: "vic1", connectionId: "main" })).connection?.budgetUsage;
      // The victim's request (ticket 1, 177), then tickets never issued at 2 000 000 each.
      const forged = [900, 901, 902, 903, 904].map((n) => ({
        reservationId: `${lease.leaseId}~${n}`,
        actualCost: "2000000",
        eventId: `evt_forged_${n}`,
      }));
      const first = await auth.settleReservations({
        items: [{ reservationId: `${lease.leaseId}~1`, actualCost: "177", eventId: "evt_1" }, ...forged],
      });
      expect(first.results.map((r) => [r.outcome, r.settledCost])).toEqual([
        [SettleOutcome.SETTLED, "177"],
        [SettleOutcome.SETTLED, "1423"],
        [SettleOutcome.SETTLED, "0"],
        [SettleOutcome.SETTLED, "0"],
        [SettleOutcome.SETTLED, "0"],
        [SettleOutcome.SETTLED, "0"],
      ]);
      const one = await auth.settleReservation({
        reservationId: `${lease.leaseId}~905`,
        actualCost: "2000000",
        eventId: "evt_forged_905",
      });
      expect([one.outcome, one.settledCost]).toEqual([SettleOutcome.SETTLED, "0"]);
      // Spend stops at the lease's allowance, far inside the budget; nothing more is held.
      expect(await usage()).toMatchObject({ spent: "1600", held: "0", remaining: String(BUDGET - 1_600n) });
      // The lease goes back: nothing is held after it, and spend never passed the budget.
      const back = await auth.returnLease({
        leaseId: lease.leaseId,
        committed: "177",
        unusedRequests: 0,
        unusedTokens: 0,
        unsure: [],
      });
      expect(back.released).toBe("0");
      expect(await usage()).toMatchObject({ spent: "1600", held: "0" });
      // The next request is still admitted (no 402 for the rest of the day).
      const next = await auth.authorize(ask);
      expect(next.budgetRemaining).toBe(String(BUDGET - 1_600n - 200n));
      // Counted once per capped settlement, with the base units refused.
      const text = await metrics.metrics();
      expect(text).toMatch(/tollgate_settlements_over_hold_total\{kind="lease"\} 6/);
      expect(text).toMatch(/tollgate_settlements_over_hold_base_units_total\{kind="lease"\} 11998577/);
    } finally {
      auth.$close();
      await app.stop();
    }
  });
});
