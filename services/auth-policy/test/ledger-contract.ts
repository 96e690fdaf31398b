// The budget behaviour every Ledger must show; run against memory (unit) and Redis (integration).
import { expect, it } from "vitest";
import { type BudgetCheck, newReservationId } from "../src/domain/budget.js";
import type { Ledger, LedgerOptions, OverHold, RateWindow } from "../src/domain/ports.js";

/** A ledger on the caller's clock with these options, fresh for each test. */
export type LedgerFactory = (opts: LedgerOptions) => Promise<Ledger> | Ledger;

const T0 = Date.UTC(2025, 0, 31, 12, 0, 0);
const at = (ms: number) => new Date(T0 + ms);
const HOLD_MS = 10_000;
const WINDOW_MS = 3 * 86_400_000;

let seq = 0;
/** A budget of `limit` in a period ending a day after T0; ids unique per test run. */
function budget(limit: bigint, scope: BudgetCheck["scope"] = "connection", name = "b"): BudgetCheck {
  seq += 1;
  return { id: `{acct}:${scope}:${name}${seq}:month:2025-01`, scope, limit, periodEndMs: T0 + 86_400_000 };
}

const rid = () => newReservationId("acct");

/** A key's window of `limit` units a minute, this request taking `cost` of them. */
const keyWindow = (name: string, unit: RateWindow["unit"], limit: number, cost: number): RateWindow => ({
  id: `{acct}:key:${name}:${unit}`,
  scope: "key",
  unit,
  limit,
  cost,
});

export function ledgerContract(make: LedgerFactory): void {
  const ledger = (extra: LedgerOptions = {}) =>
    make({ holdMs: HOLD_MS, settlementWindowMs: WINDOW_MS, ...extra });
  const hold = (l: Ledger, budgets: BudgetCheck[], amount: bigint, ms = 0, id = rid()) =>
    l.admit([], { hold: { reservationId: id, amount, budgets } }, at(ms));
  const peek = async (l: Ledger, b: BudgetCheck, ms = 0) =>
    (await l.admit([], { peek: [b] }, at(ms))).budgets[0];

  it("admits a quote that fits exactly and refuses one base unit more, holding nothing for it", async () => {
    const l = await ledger();
    const b = budget(100n);
    const first = await hold(l, [b], 60n);
    expect(first).toMatchObject({
      admitted: true,
      budgetsAdmitted: true,
      budgets: [{ spent: 0n, held: 0n }],
    });
    const over = await hold(l, [b], 41n);
    expect(over).toMatchObject({ admitted: false, budgetsAdmitted: false, rateAdmitted: true });
    expect(over.budgets).toEqual([{ spent: 0n, held: 60n }]);
    const exact = await hold(l, [b], 40n);
    expect(exact.admitted).toBe(true);
    expect(exact.budgets).toEqual([{ spent: 0n, held: 60n }]);
    expect((await hold(l, [b], 1n)).admitted).toBe(false);
    expect(await peek(l, b)).toEqual({ spent: 0n, held: 100n });
    // A zero quote still fits a full budget.
    expect((await hold(l, [b], 0n)).admitted).toBe(true);
  });

  it("refuses a quote above the whole budget and keeps amounts beyond 2^53 exact", async () => {
    const l = await ledger();
    const b = budget(9_007_199_254_740_991n);
    expect((await hold(l, [b], 9_007_199_254_740_992n)).admitted).toBe(false);
    expect((await hold(l, [b], 9_007_199_254_740_990n)).admitted).toBe(true);
    expect((await hold(l, [b], 2n)).admitted).toBe(false);
    expect((await hold(l, [b], 1n)).admitted).toBe(true);
    expect(await peek(l, b)).toEqual({ spent: 0n, held: 9_007_199_254_740_991n });
  });

  it("holds against every budget or none: the key's budget refusing leaves the connection's untouched", async () => {
    const l = await ledger();
    const conn = budget(1_000n, "connection");
    const key = budget(50n, "key");
    expect((await hold(l, [conn, key], 40n)).admitted).toBe(true);
    const refused = await hold(l, [conn, key], 20n);
    expect(refused).toMatchObject({ admitted: false, budgets: [{ held: 40n }, { held: 40n }] });
    expect(await peek(l, conn)).toEqual({ spent: 0n, held: 40n });
    expect(await peek(l, key)).toEqual({ spent: 0n, held: 40n });
  });

  it("counts no rate-limit unit when the budget refuses, and holds nothing when the rate limit refuses", async () => {
    const l = await ledger();
    const w = keyWindow(`rl${seq}`, "requests", 1, 1);
    const b = budget(10n);
    const noBudget = await l.admit([w], { hold: { reservationId: rid(), amount: 11n, budgets: [b] } }, at(0));
    expect(noBudget).toMatchObject({ admitted: false, rateAdmitted: true, budgetsAdmitted: false });
    // The refused request did not use the window's only unit.
    const ok = await l.admit([w], { hold: { reservationId: rid(), amount: 4n, budgets: [b] } }, at(1));
    expect(ok).toMatchObject({ admitted: true, counts: [{ used: 0 }] });
    const noRate = await l.admit([w], { hold: { reservationId: rid(), amount: 4n, budgets: [b] } }, at(2));
    expect(noRate).toMatchObject({ admitted: false, rateAdmitted: false, budgetsAdmitted: true });
    expect(await peek(l, b, 3)).toEqual({ spent: 0n, held: 4n });
  });

  it("frees a hold when it expires without usage, not a millisecond before", async () => {
    const l = await ledger();
    const b = budget(100n);
    expect((await hold(l, [b], 100n, 0)).admitted).toBe(true);
    expect((await hold(l, [b], 1n, HOLD_MS - 1)).admitted).toBe(false);
    expect(await peek(l, b, HOLD_MS - 1)).toEqual({ spent: 0n, held: 100n });
    expect(await peek(l, b, HOLD_MS)).toEqual({ spent: 0n, held: 0n });
    expect((await hold(l, [b], 100n, HOLD_MS)).admitted).toBe(true);
  });

  it("reports each reservation whose hold expired unused once, from its first budget", async () => {
    const expired: number[] = [];
    const l = await ledger({ onHoldsExpired: (n) => expired.push(n) });
    const conn = budget(100n, "connection");
    const key = budget(100n, "key");
    await hold(l, [conn, key], 10n, 0);
    await hold(l, [conn, key], 10n, 1);
    await hold(l, [key], 10n, 2);
    await peek(l, key, HOLD_MS + 5);
    expect(expired).toEqual([1]);
    await peek(l, conn, HOLD_MS + 5);
    expect(expired).toEqual([1, 2]);
    await peek(l, conn, HOLD_MS + 6);
    expect(expired).toEqual([1, 2]);
  });

  it("settles once: the hold becomes the actual cost, and a repeat changes nothing", async () => {
    const l = await ledger();
    const b = budget(100n);
    const id = rid();
    await hold(l, [b], 60n, 0, id);
    await hold(l, [b], 30n, 0);
    expect(await l.settle(id, 25n, "evt_1", at(1_000))).toEqual({ outcome: "settled", cost: 25n });
    expect(await peek(l, b, 1_000)).toEqual({ spent: 25n, held: 30n });
    expect(await l.settle(id, 99n, "evt_2", at(2_000))).toEqual({ outcome: "already_settled", cost: 25n });
    expect(await l.settle(id, 25n, "evt_1", at(HOLD_MS * 3))).toEqual({
      outcome: "already_settled",
      cost: 25n,
    });
    expect(await peek(l, b, 2_000)).toEqual({ spent: 25n, held: 30n });
    // 25 spent + 30 held: 45 more fit exactly, 46 do not.
    expect((await hold(l, [b], 46n, 2_000)).admitted).toBe(false);
    expect((await hold(l, [b], 45n, 2_000)).admitted).toBe(true);
  });

  it("still adds the cost of a reservation settled after its hold expired", async () => {
    const l = await ledger();
    const b = budget(100n);
    const id = rid();
    await hold(l, [b], 100n, 0, id);
    // The hold expired and was dropped by a later admission before the usage arrived.
    expect(await peek(l, b, HOLD_MS + 5)).toEqual({ spent: 0n, held: 0n });
    expect(await l.settle(id, 70n, "evt_late", at(HOLD_MS + 10))).toEqual({
      outcome: "settled_after_expiry",
      cost: 70n,
    });
    expect(await peek(l, b, HOLD_MS + 10)).toEqual({ spent: 70n, held: 0n });
    // Expired but not yet dropped: settling removes it and counts the cost once.
    const other = rid();
    await hold(l, [b], 30n, HOLD_MS + 20, other);
    expect((await l.settle(other, 5n, "evt_x", at(3 * HOLD_MS))).outcome).toBe("settled_after_expiry");
    expect(await peek(l, b, 3 * HOLD_MS)).toEqual({ spent: 75n, held: 0n });
  });

  it("adds the cost to the period the reservation was made in, not the one it is settled in", async () => {
    const l = await ledger();
    const january = budget(100n);
    const february = {
      ...january,
      id: january.id.replace("2025-01", "2025-02"),
      periodEndMs: T0 + 30 * 86_400_000,
    };
    const id = rid();
    // Held 5 s before January's end, settled 1 s into February (the hold still live).
    const end = january.periodEndMs - T0;
    await hold(l, [january], 80n, end - 5_000, id);
    expect((await l.settle(id, 50n, "evt", at(end + 1_000))).outcome).toBe("settled");
    expect(await peek(l, january, end + 1_000)).toEqual({ spent: 50n, held: 0n });
    expect(await peek(l, february, end + 1_000)).toEqual({ spent: 0n, held: 0n });
  });

  it("knows nothing of foreign ids or of reservations older than the settlement window", async () => {
    const l = await ledger();
    const b = budget(100n);
    expect(await l.settle(rid(), 5n, "evt", at(0))).toEqual({ outcome: "unknown" });
    expect(await l.settle("not-a-reservation", 5n, "evt", at(0))).toEqual({ outcome: "unknown" });
    const id = rid();
    await hold(l, [b], 10n, 0, id);
    expect(await l.settle(id, 5n, "evt", at(WINDOW_MS))).toEqual({ outcome: "unknown" });
  });

  it("peeks without holding or refusing, even over budget", async () => {
    const l = await ledger();
    const b = budget(10n);
    const id = rid();
    await hold(l, [b], 8n, 0, id);
    // A hold that expired frees its room for another; its usage, arriving late, still counts.
    await hold(l, [b], 10n, HOLD_MS);
    await l.settle(id, 7n, "evt", at(HOLD_MS + 1));
    const seen = await l.admit([], { peek: [b] }, at(HOLD_MS + 1));
    expect(seen).toMatchObject({
      admitted: true,
      budgetsAdmitted: true,
      budgets: [{ spent: 7n, held: 10n }],
    });
    expect((await hold(l, [b], 0n, HOLD_MS + 2)).admitted).toBe(false);
    expect(await peek(l, b, HOLD_MS + 3)).toEqual({ spent: 7n, held: 10n });
  });

  it("charges a reservation at most its hold, however much its usage event names", async () => {
    const l = await ledger();
    const b = budget(100n);
    const id = rid();
    await hold(l, [b], 60n, 0, id);
    // A usage event above the quote (forged, or a router that did not cap it) is capped at the hold.
    expect(await l.settle(id, 2_000_000n, "evt_forged", at(1))).toEqual({
      outcome: "settled",
      cost: 60n,
      uncharged: 1_999_940n,
    });
    expect(await l.settle(id, 2_000_000n, "evt_forged", at(2))).toEqual({
      outcome: "already_settled",
      cost: 60n,
    });
    // Also after its hold expired: never more than was reserved for it.
    const late = rid();
    await hold(l, [b], 40n, 0, late);
    expect(await l.settle(late, 9_223_372_036_854_775_807n, "evt_late", at(HOLD_MS + 1))).toEqual({
      outcome: "settled_after_expiry",
      cost: 40n,
      uncharged: 9_223_372_036_854_775_767n,
    });
    expect(await peek(l, b, HOLD_MS + 2)).toEqual({ spent: 100n, held: 0n });
  });

  it("charges a lease once per ticket and, returned, keeps only what is committed and not yet charged", async () => {
    const l = await ledger();
    const b = budget(1_000n);
    const lease = rid();
    const win = keyWindow(`k${++seq}`, "requests", 10, 4);
    const taken = await l.admit(
      [win],
      { hold: { reservationId: lease, amount: 400n, budgets: [b], lease: true } },
      at(0),
    );
    expect(taken.admitted).toBe(true);
    expect(await peek(l, b)).toEqual({ spent: 0n, held: 400n });
    // Three requests ran on it: the first charged (its usage delivered twice), two still to come.
    expect(await l.settle(`${lease}~1`, 30n, "evt_1", at(10))).toEqual({ outcome: "settled", cost: 30n });
    expect(await l.settle(`${lease}~1`, 30n, "evt_1", at(11))).toEqual({
      outcome: "already_settled",
      cost: 30n,
    });
    expect(await peek(l, b)).toEqual({ spent: 30n, held: 370n });
    // Returned with 30 + 20 + 90 committed (ticket 3 unsure: its quote of 90) and one of its 4
    // units unused: 110 stays held, 260 goes back.
    const unsure = [{ ticket: 3, quote: 90n }];
    const back = { committed: 140n, unusedRequests: 1, unusedTokens: 0, unsure };
    expect(await l.returnLease(lease, back, at(20))).toEqual({ released: 260n });
    expect(await peek(l, b)).toEqual({ spent: 30n, held: 110n });
    const after = await l.admit([{ ...win, cost: 0 }], undefined, at(21));
    expect(after.counts[0]?.used).toBe(3);
    // A second return changes nothing; the late charges end the hold, the unsure one with its quote.
    const again = { committed: 0n, unusedRequests: 3, unusedTokens: 0, unsure: [] };
    expect((await l.returnLease(lease, again, at(22))).released).toBe(0n);
    expect(await l.settle(`${lease}~2`, 20n, "evt_2", at(30))).toEqual({ outcome: "settled", cost: 20n });
    expect(await l.settle(`${lease}~3`, 15n, "evt_3", at(31))).toEqual({ outcome: "settled", cost: 15n });
    expect(await peek(l, b)).toEqual({ spent: 65n, held: 0n });
  });

  it("tells each hold's end by settlement once: a reservation's settlement, a lease's emptying charge or return", async () => {
    let ended = 0;
    const l = await make({ holdMs: HOLD_MS, settlementWindowMs: WINDOW_MS, onHoldSettled: () => ended++ });
    const conn = budget(10_000n, "connection");
    const key = budget(10_000n, "key");
    // A request's reservation: its settlement ends it; a repeat does not.
    const id = rid();
    await hold(l, [conn, key], 50n, 0, id);
    await l.settle(id, 20n, "evt_r", at(1));
    await l.settle(id, 20n, "evt_r", at(2));
    expect(ended).toBe(1);
    // A lease charged then returned with something still to charge: the last charge ends it.
    const a = rid();
    await l.admit([], { hold: { reservationId: a, amount: 400n, budgets: [conn, key], lease: true } }, at(3));
    await l.settle(`${a}~1`, 30n, "evt_a1", at(4));
    expect(ended).toBe(1);
    await l.returnLease(a, { committed: 50n, unusedRequests: 0, unusedTokens: 0, unsure: [] }, at(5));
    expect(ended).toBe(1);
    await l.settle(`${a}~2`, 20n, "evt_a2", at(6));
    expect(ended).toBe(2);
    // A lease returned with nothing left to charge: the return ends it; a repeat does not.
    const b = rid();
    await l.admit([], { hold: { reservationId: b, amount: 400n, budgets: [conn, key], lease: true } }, at(7));
    await l.settle(`${b}~1`, 30n, "evt_b1", at(8));
    const back = { committed: 30n, unusedRequests: 0, unusedTokens: 0, unsure: [] };
    await l.returnLease(b, back, at(9));
    await l.returnLease(b, back, at(10));
    expect(ended).toBe(3);
    // A lease that lapses is not settled, not even by a later charge.
    const c = rid();
    await l.admit(
      [],
      { hold: { reservationId: c, amount: 400n, budgets: [conn, key], lease: true } },
      at(11),
    );
    await peek(l, conn, HOLD_MS + 20);
    await l.settle(`${c}~1`, 30n, "evt_c1", at(HOLD_MS + 21));
    expect(ended).toBe(3);
  });

  it("counts the quote of an unsure request charged before the return, not its cost", async () => {
    const l = await ledger();
    const b = budget(1_000n);
    const lease = rid();
    await l.admit([], { hold: { reservationId: lease, amount: 300n, budgets: [b], lease: true } }, at(0));
    expect((await l.settle(`${lease}~1`, 10n, "evt_1", at(1))).outcome).toBe("settled");
    const back = { committed: 80n, unusedRequests: 0, unusedTokens: 0, unsure: [{ ticket: 1, quote: 80n }] };
    expect(await l.returnLease(lease, back, at(2))).toEqual({ released: 290n });
    expect(await peek(l, b)).toEqual({ spent: 10n, held: 0n });
  });

  it("lets a lease nobody returns lapse with the hold TTL, and still charges its late usage", async () => {
    const l = await ledger();
    const b = budget(1_000n);
    const lease = rid();
    await l.admit([], { hold: { reservationId: lease, amount: 500n, budgets: [b], lease: true } }, at(0));
    expect(await l.settle(`${lease}~1`, 100n, "evt_a", at(1))).toEqual({ outcome: "settled", cost: 100n });
    expect(await peek(l, b, HOLD_MS + 1)).toEqual({ spent: 100n, held: 0n });
    expect(await l.settle(`${lease}~2`, 7n, "evt_b", at(HOLD_MS + 2))).toEqual({
      outcome: "settled_after_expiry",
      cost: 7n,
    });
    expect(await peek(l, b, HOLD_MS + 3)).toEqual({ spent: 107n, held: 0n });
  });
  it("caps forged tickets of a live lease at what the lease reserved: spend never passes the budget", async () => {
    const l = await ledger();
    const b = budget(1_000n);
    const lease = rid();
    await l.admit([], { hold: { reservationId: lease, amount: 400n, budgets: [b], lease: true } }, at(0));
    // A legitimate request settles exactly.
    expect(await l.settle(`${lease}~1`, 30n, "evt_1", at(1))).toEqual({ outcome: "settled", cost: 30n });
    // Someone who read the lease id off the bus names tickets never issued, at 2 000 000 each.
    const forged = [];
    for (let n = 900; n <= 904; n++)
      forged.push(await l.settle(`${lease}~${n}`, 2_000_000n, `evt_f${n}`, at(2)));
    expect(forged[0]).toEqual({ outcome: "settled", cost: 370n, uncharged: 1_999_630n });
    for (const f of forged.slice(1))
      expect(f).toEqual({ outcome: "settled", cost: 0n, uncharged: 2_000_000n });
    // Idempotent by ticket: a redelivery answers the capped charge and moves nothing.
    expect(await l.settle(`${lease}~900`, 2_000_000n, "evt_f900", at(3))).toEqual({
      outcome: "already_settled",
      cost: 370n,
    });
    // Spend stops at what the lease reserved (never past the budget); nothing is held past it.
    expect(await peek(l, b, 3)).toEqual({ spent: 400n, held: 0n });
    const back = { committed: 80n, unusedRequests: 0, unusedTokens: 0, unsure: [] };
    expect(await l.returnLease(lease, back, at(4))).toEqual({ released: 0n });
    expect(await l.settle(`${lease}~2`, 50n, "evt_2", at(5))).toMatchObject({ cost: 0n, uncharged: 50n });
    expect(await peek(l, b, 6)).toEqual({ spent: 400n, held: 0n });
    // What is left of the budget is still there for the next requests.
    expect((await hold(l, [b], 600n, 7)).admitted).toBe(true);
    expect((await hold(l, [b], 1n, 8)).admitted).toBe(false);
  });

  it("settles a lease that holds no budget at its cost, over no hold, and keeps its windows' units", async () => {
    const overs: OverHold[] = [];
    const l = await ledger({ onOverHold: (o) => overs.push(o) });
    seq += 1;
    const requests = keyWindow(`nb${seq}`, "requests", 100, 4);
    const tokens = keyWindow(`nb${seq}`, "tokens", 10_000, 400);
    // A lease of rate-limit units only: a connection with limits and no budget.
    const lease = rid();
    const taken = await l.admit(
      [requests, tokens],
      { hold: { reservationId: lease, amount: 0n, budgets: [], lease: true } },
      at(0),
    );
    expect(taken.admitted).toBe(true);
    expect(await l.settle(`${lease}~1`, 4n, "evt_1", at(1))).toEqual({ outcome: "settled", cost: 4n });
    expect(await l.settle(`${lease}~1`, 4n, "evt_1", at(2))).toEqual({
      outcome: "already_settled",
      cost: 4n,
    });
    expect(await l.settle(`${lease}~2`, 7n, "evt_2", at(3))).toEqual({ outcome: "settled", cost: 7n });
    expect(overs).toEqual([]);
    // Returned with 2 requests and 150 tokens unused: the windows count what was used.
    const back = { committed: 11n, unusedRequests: 2, unusedTokens: 150, unsure: [] };
    expect(await l.returnLease(lease, back, at(4))).toEqual({ released: 0n });
    const after = await l.admit(
      [
        { ...requests, cost: 0 },
        { ...tokens, cost: 0 },
      ],
      undefined,
      at(5),
    );
    expect(after.counts.map((c) => c.used)).toEqual([2, 250]);
    expect(await l.settle(`${lease}~3`, 5n, "evt_3", at(HOLD_MS + 1))).toEqual({
      outcome: "settled_after_expiry",
      cost: 5n,
    });
    expect(overs).toEqual([]);
    // A lease that holds a budget still reports a charge above what it reserved, once.
    const b = budget(1_000n);
    const held = rid();
    await l.admit([], { hold: { reservationId: held, amount: 10n, budgets: [b], lease: true } }, at(6));
    expect(await l.settle(`${held}~1`, 25n, "evt_h1", at(7))).toEqual({
      outcome: "settled",
      cost: 10n,
      uncharged: 15n,
    });
    expect(overs).toEqual([
      { kind: "lease", reservationId: `${held}~1`, eventId: "evt_h1", asked: 25n, charged: 10n },
    ]);
    expect(await peek(l, b, 8)).toEqual({ spent: 10n, held: 0n });
  });

  it("charges a returned lease at most what its return left to charge: forged tickets get nothing", async () => {
    const l = await ledger();
    const b = budget(1_000n);
    const lease = rid();
    await l.admit([], { hold: { reservationId: lease, amount: 400n, budgets: [b], lease: true } }, at(0));
    expect(await l.settle(`${lease}~1`, 30n, "evt_1", at(1))).toEqual({ outcome: "settled", cost: 30n });
    // Returned with ticket 2 (50) still to be charged and ticket 3 unsure (its quote 40).
    const back = { committed: 120n, unusedRequests: 0, unusedTokens: 0, unsure: [{ ticket: 3, quote: 40n }] };
    expect(await l.returnLease(lease, back, at(2))).toEqual({ released: 280n });
    // An unsure ticket is charged at most its quote; the legitimate ones settle exactly.
    expect(await l.settle(`${lease}~2`, 50n, "evt_2", at(3))).toEqual({ outcome: "settled", cost: 50n });
    expect(await l.settle(`${lease}~3`, 25n, "evt_3", at(4))).toEqual({ outcome: "settled", cost: 25n });
    expect(await peek(l, b, 5)).toEqual({ spent: 105n, held: 0n });
    // The forged ones, after the return, find nothing left to charge.
    expect(await l.settle(`${lease}~900`, 50_000n, "evt_f", at(6))).toEqual({
      outcome: "settled",
      cost: 0n,
      uncharged: 50_000n,
    });
    expect(await l.settle(lease, 50_000n, "evt_g", at(7))).toMatchObject({ cost: 0n });
    // Told == spent: the budget shows exactly the legitimate costs, and nothing is held.
    expect(await peek(l, b, 8)).toEqual({ spent: 105n, held: 0n });

    // An unsure ticket charged before its other tickets cannot take more than its quote.
    const other = rid();
    await l.admit([], { hold: { reservationId: other, amount: 400n, budgets: [b], lease: true } }, at(10));
    const back2 = { committed: 90n, unusedRequests: 0, unusedTokens: 0, unsure: [{ ticket: 1, quote: 40n }] };
    expect(await l.returnLease(other, back2, at(11))).toEqual({ released: 310n });
    expect(await l.settle(`${other}~1`, 70n, "evt_o1", at(12))).toEqual({
      outcome: "settled",
      cost: 40n,
      uncharged: 30n,
    });
    expect(await l.settle(`${other}~2`, 50n, "evt_o2", at(13))).toEqual({ outcome: "settled", cost: 50n });
    expect(await peek(l, b, 14)).toEqual({ spent: 195n, held: 0n });
  });
}
