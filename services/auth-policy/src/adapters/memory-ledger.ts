import {
  type BudgetCount,
  DEFAULT_RESERVATION_TTL_SECONDS,
  DEFAULT_SETTLEMENT_WINDOW_SECONDS,
  fits,
  leaseTicketOf,
} from "../domain/budget.js";
import type { Admission, Ledger, LedgerOptions, OverHold, WindowCount } from "../domain/ports.js";
import { BUCKET_MS, countWindow, WINDOW_BUCKETS } from "../domain/rate-limit.js";
import type { Settlement } from "../domain/types.js";

interface BudgetState {
  spent: bigint;
  held: bigint;
  /** Live (or expired, not yet purged) holds: reservation id → amount and expiry. */
  holds: Map<string, Hold>;
  /** The same holds by expiry, soonest first. */
  expiries: ExpiryHeap;
  keepUntilMs: number;
}

interface Hold {
  reservationId: string;
  amount: bigint;
  expiresMs: number;
  /** Whether this is the reservation's first budget, where its expiry is reported. */
  primary: boolean;
  /** Its place in its budget's expiry heap. */
  index: number;
}

interface ReservationState {
  amount: bigint;
  expiresMs: number;
  budgets: string[];
  keepUntilMs: number;
  settled?: { cost: bigint; eventId: string };
  /** A lease: its windows and bucket, what was charged on it, by event id, and whether it was returned. */
  lease?: {
    windows: Array<{ id: string; unit: "requests" | "tokens" }>;
    bucket: number;
    /** Cost charged per ticket (or per event id, for a charge naming no ticket). */
    charged: Map<string, bigint>;
    total: bigint;
    returned: boolean;
    /**
     * Once returned: what may still be charged on it (what the return left committed and not yet
     * charged); before, the allowance less `total` is.
     */
    left?: bigint;
    /** Once returned: the quote of each unsure ticket not yet charged. */
    unsure: Map<string, bigint>;
  };
}

/**
 * A binary min-heap of a budget's holds by expiry, each knowing its index: the next hold to
 * expire is read in O(1), and adding, expiring or settling one is O(log n).
 */
class ExpiryHeap {
  private readonly items: Hold[] = [];

  get size(): number {
    return this.items.length;
  }

  peek(): Hold | undefined {
    return this.items[0];
  }

  push(e: Hold): void {
    e.index = this.items.length;
    this.items.push(e);
    this.up(e.index);
  }

  remove(e: Hold): void {
    const last = this.items.pop()!;
    if (last === e) return;
    this.items[e.index] = last;
    last.index = e.index;
    this.up(last.index);
    this.down(last.index);
  }

  private swap(i: number, j: number): void {
    const a = this.items[i]!;
    const b = this.items[j]!;
    this.items[i] = b;
    this.items[j] = a;
    a.index = j;
    b.index = i;
  }

  private up(i: number): void {
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (this.items[parent]!.expiresMs <= this.items[i]!.expiresMs) return;
      this.swap(i, parent);
      i = parent;
    }
  }

  private down(i: number): void {
    const n = this.items.length;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let least = i;
      if (l < n && this.items[l]!.expiresMs < this.items[least]!.expiresMs) least = l;
      if (r < n && this.items[r]!.expiresMs < this.items[least]!.expiresMs) least = r;
      if (least === i) return;
      this.swap(i, least);
      i = least;
    }
  }
}

/** What the memory ledger holds (for tests of its memory). */
export interface MemoryLedger extends Ledger {
  retained(): { holds: number; reservations: number; budgets: number };
}

/**
 * Rate-limit counters, budget holds and spend in this process's memory, for the all-in-one
 * process without REDIS_URL: the Redis ledger's semantics on the caller's clock. Every method
 * runs to completion without awaiting, so each is atomic.
 */
export function createMemoryLedger(opts: LedgerOptions = {}): MemoryLedger {
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

  const newBudget = (keepUntilMs: number): BudgetState => ({
    spent: 0n,
    held: 0n,
    holds: new Map(),
    expiries: new ExpiryHeap(),
    keepUntilMs,
  });

  const drop = (b: BudgetState, h: Hold) => {
    b.held -= h.amount;
    b.holds.delete(h.reservationId);
    b.expiries.remove(h);
  };

  // Drops the holds of a budget that have expired at nowMs, soonest first and O(log n) each,
  // never looking at a live one; counts the reservations whose first budget this is, so that
  // each expired reservation is reported once.
  const purge = (b: BudgetState, nowMs: number): number => {
    let expired = 0;
    for (let h = b.expiries.peek(); h && h.expiresMs <= nowMs; h = b.expiries.peek()) {
      drop(b, h);
      if (h.primary) expired++;
    }
    return expired;
  };

  // Sets what a reservation still holds in one budget: dropped at zero, else kept with its expiry.
  const holdLeft = (b: BudgetState, h: Hold, left: bigint) => {
    if (left <= 0n) return drop(b, h);
    b.held -= h.amount - left;
    h.amount = left;
  };

  // A settlement's outcome; a cost capped below what it asked is told to onOverHold.
  const settled = (over: Omit<OverHold, "charged">, cost: bigint, expired: boolean): Settlement => {
    const outcome = expired ? "settled_after_expiry" : "settled";
    if (cost >= over.asked) return { outcome, cost };
    opts.onOverHold?.({ ...over, charged: cost });
    return { outcome, cost, uncharged: over.asked - cost };
  };

  // One request's cost charged against a lease, once per ticket: out of its hold (as far as it
  // goes; after the return, an unsure request's whole quote) into spend. Never more than is left
  // of the lease (docs/money.md, "Leases"): its allowance less what was charged on it, or once
  // returned what the return left to charge; an unsure ticket never more than its quote. A lease
  // that holds no budget only records the ticket as settled at its cost.
  const charge = (
    settledId: string,
    reservationId: string,
    r: ReservationState,
    lease: NonNullable<ReservationState["lease"]>,
    asked: bigint,
    eventId: string,
    by: string,
    nowMs: number,
  ): Settlement => {
    const prior = lease.charged.get(by);
    if (prior !== undefined) return { outcome: "already_settled", cost: prior };
    if (r.budgets.length === 0) {
      // A lease of rate-limit units only (no budget applies): nothing was reserved for the cost,
      // so there is nothing to cap it at and nothing to count as over its hold.
      lease.charged.set(by, asked);
      return { outcome: r.expiresMs <= nowMs ? "settled_after_expiry" : "settled", cost: asked };
    }
    const unsure = lease.unsure.get(by);
    let room = lease.left ?? r.amount - lease.total;
    if (room < 0n) room = 0n;
    if (unsure !== undefined && unsure < room) room = unsure;
    const cost = asked < room ? asked : room;
    const out = unsure ?? cost;
    let left = (lease.left ?? r.amount - lease.total) - out;
    if (left < 0n) left = 0n;
    r.budgets.forEach((id, j) => {
      const b = budgets.get(id) ?? newBudget(r.keepUntilMs);
      const h = b.holds.get(reservationId);
      if (h) {
        const after = h.amount - out;
        holdLeft(b, h, after < left ? after : left);
        if (j === 0 && !b.holds.has(reservationId)) opts.onHoldSettled?.();
      }
      b.spent += cost;
      budgets.set(id, b);
    });
    lease.charged.set(by, cost);
    lease.total += cost;
    if (lease.left !== undefined) lease.left = left;
    return settled({ kind: "lease", reservationId: settledId, eventId, asked }, cost, r.expiresMs <= nowMs);
  };

  const ledger: MemoryLedger = {
    retained: () => {
      let holds = 0;
      for (const b of budgets.values()) holds += b.holds.size;
      return { holds, reservations: reservations.size, budgets: budgets.size };
    },
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
            const b = budgets.get(check.id) ?? newBudget(0);
            const before = b.holds.get(hold.reservationId);
            if (before) drop(b, before);
            const h: Hold = {
              reservationId: hold.reservationId,
              amount: hold.amount,
              expiresMs,
              primary: j === 0,
              index: 0,
            };
            b.held += hold.amount;
            b.holds.set(hold.reservationId, h);
            b.expiries.push(h);
            b.keepUntilMs = Math.max(b.keepUntilMs, check.periodEndMs + windowMs);
            budgets.set(check.id, b);
          });
          reservations.set(hold.reservationId, {
            amount: hold.amount,
            expiresMs,
            budgets: checks.map((c) => c.id),
            keepUntilMs: nowMs + windowMs,
            ...(hold.lease
              ? {
                  lease: {
                    windows: list.map((w) => ({ id: w.id, unit: w.unit })),
                    bucket: current,
                    charged: new Map(),
                    total: 0n,
                    returned: false,
                    unsure: new Map(),
                  },
                }
              : {}),
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

    async returnLease(leaseId, back, now) {
      const r = reservations.get(leaseId);
      if (!r?.lease || r.lease.returned || r.keepUntilMs <= now.getTime()) return { released: 0n };
      r.lease.returned = true;
      let charged = r.lease.total;
      for (const u of back.unsure) {
        const paid = r.lease.charged.get(`t:${u.ticket}`);
        if (paid === undefined) r.lease.unsure.set(`t:${u.ticket}`, u.quote);
        else charged += u.quote - paid;
      }
      let keep = back.committed - charged;
      if (keep < 0n) keep = 0n;
      // What may still be charged on it: what stays committed, within what is left of the allowance.
      const allowance = r.amount - r.lease.total;
      r.lease.left = allowance < keep ? (allowance > 0n ? allowance : 0n) : keep;
      let released = 0n;
      r.budgets.forEach((id, j) => {
        const b = budgets.get(id);
        const h = b?.holds.get(leaseId);
        if (!b || !h) return;
        const left = h.amount < keep ? h.amount : keep;
        if (j === 0) released = h.amount - left;
        holdLeft(b, h, left);
        if (j === 0 && left <= 0n) opts.onHoldSettled?.();
      });
      for (const w of r.lease.windows) {
        const buckets = windows.get(w.id);
        const units = buckets?.get(r.lease.bucket);
        if (!buckets || units === undefined) continue;
        const give = Math.min(units, w.unit === "tokens" ? back.unusedTokens : back.unusedRequests);
        buckets.set(r.lease.bucket, units - give);
      }
      return { released };
    },

    async settle(id, cost, eventId, now) {
      const nowMs = now.getTime();
      const ticket = leaseTicketOf(id);
      const reservationId = ticket?.leaseId ?? id;
      const r = reservations.get(reservationId);
      if (!r || r.keepUntilMs <= nowMs) return { outcome: "unknown" };
      if (r.settled) return { outcome: "already_settled", cost: r.settled.cost };
      if (r.lease) {
        const by = ticket ? `t:${ticket.ticket}` : `e:${eventId}`;
        return charge(id, reservationId, r, r.lease, cost, eventId, by, nowMs);
      }
      // Never more than its hold, the request's quote (docs/money.md, "Charges").
      const charged = cost < r.amount ? cost : r.amount;
      for (const id of r.budgets) {
        const b = budgets.get(id) ?? newBudget(r.keepUntilMs);
        const h = b.holds.get(reservationId);
        if (h) drop(b, h);
        b.spent += charged;
        budgets.set(id, b);
      }
      r.settled = { cost: charged, eventId };
      opts.onHoldSettled?.();
      return settled(
        { kind: "reservation", reservationId: id, eventId, asked: cost },
        charged,
        r.expiresMs <= nowMs,
      );
    },
  };
  return ledger;
}
