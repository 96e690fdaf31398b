// Batch settlement (settleReservations) on a Ledger; run against memory (unit) and Redis
// (integration), so that the batch path and settle() cannot drift apart.
import { expect, it } from "vitest";
import { type BudgetCheck, newReservationId, settleReservations } from "../src/domain/budget.js";
import type { Ledger, LedgerOptions } from "../src/domain/ports.js";

/** A ledger on the caller's clock with these options, fresh for each test. */
export type BatchLedgerFactory = (opts: LedgerOptions) => Promise<Ledger> | Ledger;

const T0 = Date.UTC(2025, 0, 31, 12, 0, 0);
const at = (ms: number) => new Date(T0 + ms);
const HOLD_MS = 10_000;
const WINDOW_MS = 3 * 86_400_000;

let seq = 0;
function budget(limit: bigint, account: string): BudgetCheck {
  seq += 1;
  return {
    id: `{${account}}:connection:batch${seq}:month:2025-01`,
    scope: "connection",
    limit,
    periodEndMs: T0 + 86_400_000,
  };
}

export function settleBatchContract(make: BatchLedgerFactory): void {
  const ledger = () => make({ holdMs: HOLD_MS, settlementWindowMs: WINDOW_MS });
  const hold = async (l: Ledger, b: BudgetCheck, amount: bigint, account: string) => {
    const reservationId = newReservationId(account);
    const a = await l.admit([], { hold: { reservationId, amount, budgets: [b] } }, at(0));
    expect(a.admitted).toBe(true);
    return reservationId;
  };
  const peek = async (l: Ledger, b: BudgetCheck, ms: number) =>
    (await l.admit([], { peek: [b] }, at(ms))).budgets[0];

  it("settles a batch across accounts once each: holds become spend, a replay changes nothing", async () => {
    const l = await ledger();
    const a = budget(1_000n, "acct_a");
    const b = budget(1_000n, "acct_b");
    const a1 = await hold(l, a, 300n, "acct_a");
    const a2 = await hold(l, a, 200n, "acct_a");
    const b1 = await hold(l, b, 400n, "acct_b");
    const open = await hold(l, b, 100n, "acct_b");
    const batch = [
      { reservationId: a1, cost: 120n, eventId: "evt_a1" },
      { reservationId: b1, cost: 400n, eventId: "evt_b1" },
      // The same reservation twice in one batch (a publisher retry under a new message id).
      { reservationId: a1, cost: 120n, eventId: "evt_a1" },
      { reservationId: a2, cost: 0n, eventId: "evt_a2" },
      { reservationId: newReservationId("acct_a"), cost: 5n, eventId: "evt_gone" },
      { reservationId: "not-a-reservation", cost: 5n, eventId: "evt_foreign" },
      { reservationId: "", cost: 5n, eventId: "evt_empty" },
    ];
    const first = await settleReservations(l, batch, at(1_000));
    expect(first.slice(0, 6)).toEqual([
      { outcome: "settled", cost: 120n },
      { outcome: "settled", cost: 400n },
      { outcome: "already_settled", cost: 120n },
      { outcome: "settled", cost: 0n },
      { outcome: "unknown" },
      { outcome: "unknown" },
    ]);
    expect(first[6]).toMatchObject({ code: "invalid_argument" });
    // Told == committed: each budget's spend is the sum of its settled costs, and only the
    // reservation nobody settled still holds.
    expect(await peek(l, a, 1_000)).toEqual({ spent: 120n, held: 0n });
    expect(await peek(l, b, 1_000)).toEqual({ spent: 400n, held: 100n });

    // The batch delivered again (a crash between settling and acknowledging): nothing moves.
    const again = await settleReservations(l, batch, at(2_000));
    expect(again.slice(0, 4).map((r) => ("outcome" in r ? r.outcome : r))).toEqual([
      "already_settled",
      "already_settled",
      "already_settled",
      "already_settled",
    ]);
    expect(again[1]).toEqual({ outcome: "already_settled", cost: 400n });
    expect(await peek(l, a, 2_000)).toEqual({ spent: 120n, held: 0n });
    expect(await peek(l, b, 2_000)).toEqual({ spent: 400n, held: 100n });
    // A later settlement with another cost keeps the first one.
    expect(
      await settleReservations(l, [{ reservationId: b1, cost: 1n, eventId: "evt_other" }], at(3_000)),
    ).toEqual([{ outcome: "already_settled", cost: 400n }]);
    expect(
      (await settleReservations(l, [{ reservationId: open, cost: 60n, eventId: "e" }], at(HOLD_MS + 1)))[0],
    ).toEqual({ outcome: "settled_after_expiry", cost: 60n });
    expect(await peek(l, b, HOLD_MS + 1)).toEqual({ spent: 460n, held: 0n });
  });

  it("answers an empty batch with nothing and refuses more than 1000 items", async () => {
    const l = await ledger();
    expect(await settleReservations(l, [], at(0))).toEqual([]);
    const many = Array.from({ length: 1_001 }, (_, k) => ({
      reservationId: newReservationId("acct"),
      cost: 1n,
      eventId: `e${k}`,
    }));
    await expect(settleReservations(l, many, at(0))).rejects.toMatchObject({ code: "invalid_argument" });
  });
  it("charges a batch's forged lease tickets at most what the lease reserved, and a reservation its hold", async () => {
    const l = await ledger();
    const b = budget(1_000_000n, "acct_v");
    const lease = newReservationId("acct_v");
    const granted = await l.admit(
      [],
      { hold: { reservationId: lease, amount: 2_000n, budgets: [b], lease: true } },
      at(0),
    );
    expect(granted.admitted).toBe(true);
    const alone = await hold(l, b, 300n, "acct_v");
    // One batch: the victim's two requests, five tickets never issued at 50 000 each, and a
    // reservation's usage event naming far more than its quote.
    const batch = [
      { reservationId: `${lease}~1`, cost: 531n, eventId: "evt_1" },
      ...[900, 901, 902, 903, 904].map((n) => ({
        reservationId: `${lease}~${n}`,
        cost: 50_000n,
        eventId: `evt_forged_${n}`,
      })),
      { reservationId: `${lease}~2`, cost: 351n, eventId: "evt_2" },
      { reservationId: alone, cost: 2_000_000n, eventId: "evt_alone" },
    ];
    const first = await settleReservations(l, batch, at(1_000));
    expect(first[0]).toEqual({ outcome: "settled", cost: 531n });
    expect(first[1]).toEqual({ outcome: "settled", cost: 1_469n, uncharged: 48_531n });
    for (const r of first.slice(2, 7)) expect(r).toMatchObject({ outcome: "settled", cost: 0n });
    expect(first[7]).toEqual({ outcome: "settled", cost: 300n, uncharged: 1_999_700n });
    // Spend never passes what was reserved (the lease and the hold), nor the budget.
    const seen = await peek(l, b, 1_000);
    expect(seen).toEqual({ spent: 2_300n, held: 0n });
    // Redelivered: nothing moves.
    const again = await settleReservations(l, batch, at(2_000));
    expect(again.every((r) => !(r instanceof Error) && r.outcome === "already_settled")).toBe(true);
    expect(
      await l.returnLease(
        lease,
        { committed: 882n, unusedRequests: 0, unusedTokens: 0, unsure: [] },
        at(2_000),
      ),
    ).toEqual({ released: 0n });
    expect(await peek(l, b, 2_000)).toEqual({ spent: 2_300n, held: 0n });
  });
}
