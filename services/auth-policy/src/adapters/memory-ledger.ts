import {
  type BudgetCount,
  DEFAULT_RESERVATION_TTL_SECONDS,
  DEFAULT_SETTLEMENT_WINDOW_SECONDS,
  fits,
} from "../domain/budget.js";
import type { Admission, Ledger, LedgerOptions, WindowCount } from "../domain/ports.js";
import { BUCKET_MS, countWindow, WINDOW_BUCKETS } from "../domain/rate-limit.js";

interface BudgetState {
  spent: bigint;
  held: bigint;
  /** Live (or expired, not yet purged) holds: reservation id → amount and expiry. */
  holds: Map<string, { amount: bigint; expiresMs: number; primary: boolean }>;
  keepUntilMs: number;
}

interface ReservationState {
  amount: bigint;
  expiresMs: number;
  budgets: string[];
  keepUntilMs: number;
  settled?: { cost: bigint; eventId: string };
}

/**
 * Rate-limit counters, budget holds and spend in this process's memory, for the all-in-one
 * process without REDIS_URL: the Redis ledger's semantics on the caller's clock. Every method
 * runs to completion without awaiting, so each is atomic.
 */
export function createMemoryLedger(opts: LedgerOptions = {}): Ledger {
  const holdMs = opts.holdMs ?? DEFAULT_RESERVATION_TTL_SECONDS * 1_000;
  const windowMs = opts.settlementWindowMs ?? DEFAULT_SETTLEMENT_WINDOW_SECONDS * 1_000;
  const windows = new Map<string, Map<number, number>>();
  const budgets = new Map<string, BudgetState>();
  const reservations = new Map<string, ReservationState>();
  let nextSweepMs = 0;

  // Forgets reservations and periods past their settlement window, once a minute at most.
  const sweep = (nowMs: number) => {
    if (nowMs < nextSweepMs) return;
    nextSweepMs = nowMs + 60_000;
    for (const [id, r] of reservations) if (r.keepUntilMs <= nowMs) reservations.delete(id);
    for (const [id, b] of budgets) if (b.keepUntilMs <= nowMs) budgets.delete(id);
  };

  // Drops the holds of a budget that have expired at nowMs; counts the reservations whose first
  // budget this is, so that each expired reservation is reported once.
  const purge = (b: BudgetState, nowMs: number): number => {
    let expired = 0;
    for (const [id, h] of b.holds) {
      if (h.expiresMs > nowMs) continue;
      b.held -= h.amount;
      b.holds.delete(id);
      if (h.primary) expired++;
    }
    return expired;
  };

  const ledger: Ledger = {
    async admit(list, ask, now) {
      const nowMs = now.getTime();
      sweep(nowMs);
      const current = Math.floor(nowMs / BUCKET_MS);
      const counts: WindowCount[] = [];
      let rateAdmitted = true;
      for (const w of list) {
        const buckets = windows.get(w.id) ?? new Map<number, number>();
        // Forget what no window can see any more.
        for (const b of buckets.keys()) if (b <= current - WINDOW_BUCKETS) buckets.delete(b);
        if (buckets.size === 0) windows.delete(w.id);
        const count = countWindow(buckets, w.limit, w.cost, nowMs);
        if (count.retryAfterMs !== 0) rateAdmitted = false;
        counts.push(count);
      }

      const checks = ask ? ("hold" in ask ? ask.hold.budgets : ask.peek) : [];
      const hold = ask && "hold" in ask ? ask.hold : undefined;
      const budgetCounts: BudgetCount[] = [];
      let budgetsAdmitted = true;
      let expired = 0;
      for (const check of checks) {
        const b = budgets.get(check.id);
        if (b) expired += purge(b, nowMs);
        const count = { spent: b?.spent ?? 0n, held: b?.held ?? 0n };
        if (hold && !fits(check, count, hold.amount)) budgetsAdmitted = false;
        budgetCounts.push(count);
      }
      if (expired > 0) opts.onHoldsExpired?.(expired);

      const admitted = rateAdmitted && budgetsAdmitted;
      if (admitted) {
        for (const w of list) {
          if (w.cost === 0) continue;
          const buckets = windows.get(w.id) ?? new Map<number, number>();
          buckets.set(current, (buckets.get(current) ?? 0) + w.cost);
          windows.set(w.id, buckets);
        }
        if (hold) {
          const expiresMs = nowMs + holdMs;
          checks.forEach((check, j) => {
            const b = budgets.get(check.id) ?? { spent: 0n, held: 0n, holds: new Map(), keepUntilMs: 0 };
            b.held += hold.amount;
            b.holds.set(hold.reservationId, { amount: hold.amount, expiresMs, primary: j === 0 });
            b.keepUntilMs = Math.max(b.keepUntilMs, check.periodEndMs + windowMs);
            budgets.set(check.id, b);
          });
          reservations.set(hold.reservationId, {
            amount: hold.amount,
            expiresMs,
            budgets: checks.map((c) => c.id),
            keepUntilMs: nowMs + windowMs,
          });
        }
      }
      const decision: Admission = {
        admitted,
        rateAdmitted,
        budgetsAdmitted,
        nowMs,
        counts,
        budgets: budgetCounts,
      };
      return decision;
    },

    async consume(list, now) {
      return ledger.admit(list, undefined, now);
    },

    async settle(reservationId, cost, eventId, now) {
      const nowMs = now.getTime();
      const r = reservations.get(reservationId);
      if (!r || r.keepUntilMs <= nowMs) return { outcome: "unknown" };
      if (r.settled) return { outcome: "already_settled", cost: r.settled.cost };
      for (const id of r.budgets) {
        const b = budgets.get(id) ?? { spent: 0n, held: 0n, holds: new Map(), keepUntilMs: r.keepUntilMs };
        const h = b.holds.get(reservationId);
        if (h) {
          b.held -= h.amount;
          b.holds.delete(reservationId);
        }
        b.spent += cost;
        budgets.set(id, b);
      }
      r.settled = { cost, eventId };
      return { outcome: r.expiresMs <= nowMs ? "settled_after_expiry" : "settled", cost };
    },
  };
  return ledger;
}
