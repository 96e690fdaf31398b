// Budgets (spend caps) per connection and per key, and the reservations that hold a request's
// quote against them (docs/architecture.md, "The account door, one request", step 2).
//
// A budget counts, per period, `spent` (settled actual costs) and `held` (the quotes of live
// reservations). A request is admitted when `spent + held + quote <= amount` for every budget
// that applies; only then is its quote held, in one atomic step with the rate-limit counters.
// A hold stops counting when it is settled (its actual cost moves into `spent`) or when it
// expires after the reservation TTL without usage. A settlement that arrives after the hold
// expired still adds the actual cost to the spend of the period the reservation was made in.

import { randomBase62 } from "@tollgate/kit/ids";
import { AuthError } from "./errors.js";
import type { Ledger } from "./ports.js";
import type {
  Budget,
  BudgetCheck,
  BudgetCount,
  BudgetPeriod,
  BudgetScope,
  SettleItem,
  Settlement,
} from "./types.js";

export type {
  Budget,
  BudgetCheck,
  BudgetCount,
  BudgetPeriod,
  BudgetScope,
  SettleItem,
  Settlement,
  SettleOutcome,
} from "./types.js";

/** Largest budget amount: budget arithmetic in Redis Lua (doubles) is exact below 2^53. */
export const MAX_BUDGET_AMOUNT = BigInt(Number.MAX_SAFE_INTEGER);
/** Longest `{ days: N }` period. */
export const MAX_PERIOD_DAYS = 366;
/**
 * How long a hold counts when no usage arrives (RESERVATION_TTL_SECONDS): well above the
 * longest upstream timeout (120 s), so a request still running is never released early.
 */
export const DEFAULT_RESERVATION_TTL_SECONDS = 600;
/**
 * How long a reservation can still be settled (SETTLEMENT_WINDOW_SECONDS), and how long a
 * period's spend is kept after the period ends: metering's event dedupe window (7 days).
 */
export const DEFAULT_SETTLEMENT_WINDOW_SECONDS = 7 * 24 * 3_600;

/** One period of a budget: [startMs, endMs) in UTC, and a tag naming it in storage keys. */
export interface Period {
  /** e.g. "month:2025-06", "week:2025-06-02", "day:2025-06-01", "days-30:2025-05-12". */
  tag: string;
  startMs: number;
  endMs: number;
}

const DAY_MS = 86_400_000;
const isoDay = (ms: number) => new Date(ms).toISOString().slice(0, 10);
const mod = (a: number, n: number) => ((a % n) + n) % n;

/** The period of `period` that holds `now`. Periods are UTC; `{ days }` counts from the epoch. */
export function periodAt(period: BudgetPeriod, now: Date): Period {
  const t = now.getTime();
  const day = Math.floor(t / DAY_MS);
  if (period === "month") {
    const d = new Date(t);
    const y = d.getUTCFullYear();
    const m = d.getUTCMonth();
    return {
      tag: `month:${isoDay(Date.UTC(y, m, 1)).slice(0, 7)}`,
      startMs: Date.UTC(y, m, 1),
      endMs: Date.UTC(y, m + 1, 1),
    };
  }
  let startDay: number;
  let days: number;
  let name: string;
  if (period === "day") {
    [startDay, days, name] = [day, 1, "day"];
  } else if (period === "week") {
    // 1970-01-01 was a Thursday: day + 3 counts from a Monday.
    [startDay, days, name] = [day - mod(day + 3, 7), 7, "week"];
  } else {
    [startDay, days, name] = [day - mod(day, period.days), period.days, `days-${period.days}`];
  }
  const startMs = startDay * DAY_MS;
  return { tag: `${name}:${isoDay(startMs)}`, startMs, endMs: startMs + days * DAY_MS };
}

/** A period as one storage string: "month", "week", "day" or "days:N". */
export function encodePeriod(period: BudgetPeriod): string {
  return typeof period === "string" ? period : `days:${period.days}`;
}

/** A period as people read it: "month", "week", "day" or "N-day". */
export function periodName(period: BudgetPeriod): string {
  return typeof period === "string" ? period : `${period.days}-day`;
}

/**
 * Whether `next` gives a budget that exists as `current` another period. Spend is counted per
 * period (one counter per period tag), so such a budget counts its new period from zero and
 * forgets what was spent in it so far (docs/money.md, "Budget periods").
 */
export function periodChanged(current: Budget | undefined, next: Budget | undefined): boolean {
  return !!current && !!next && encodePeriod(current.period) !== encodePeriod(next.period);
}

/** The inverse of encodePeriod; undefined for anything else. */
export function decodePeriod(text: string): BudgetPeriod | undefined {
  if (text === "month" || text === "week" || text === "day") return text;
  const m = /^days:([1-9][0-9]{0,2})$/.exec(text);
  const days = m ? Number(m[1]) : 0;
  return days >= 1 && days <= MAX_PERIOD_DAYS ? { days } : undefined;
}

/** A budget as one storage string: "<amount>|<period>". */
export function encodeBudget(b: Budget): string {
  return `${b.amount}|${encodePeriod(b.period)}`;
}

/** The inverse of encodeBudget; undefined for anything else. */
export function decodeBudget(text: string | undefined): Budget | undefined {
  const m = text ? /^(0|[1-9][0-9]*)\|(.+)$/.exec(text) : null;
  const period = m ? decodePeriod(m[2]!) : undefined;
  return m && period ? { amount: BigInt(m[1]!), period } : undefined;
}

/** The budgets of one request, connection first. */
export function budgetChecks(args: {
  accountId: string;
  connectionId: string;
  /**
   * Whose key budget counter: the key's lineage (keys.ts, lineageOf), never a rotated key's own
   * id, so that a key and its replacements share one counter.
   */
  keyLineageId: string;
  connectionBudget?: Budget | undefined;
  keyBudget?: Budget | undefined;
  now: Date;
}): BudgetCheck[] {
  const tag = `{${args.accountId}}`;
  const out: BudgetCheck[] = [];
  const add = (scope: BudgetScope, owner: string, b: Budget | undefined) => {
    if (!b) return;
    const p = periodAt(b.period, args.now);
    out.push({ id: `${tag}:${scope}:${owner}:${p.tag}`, scope, limit: b.amount, periodEndMs: p.endMs });
  };
  add("connection", args.connectionId, args.connectionBudget);
  add("key", args.keyLineageId, args.keyBudget);
  return out;
}

/** Left of a budget once `extra` is held too: never below zero (late usage may overshoot). */
export function remainingOf(check: BudgetCheck, count: BudgetCount, extra: bigint): bigint {
  const left = check.limit - count.spent - count.held - extra;
  return left > 0n ? left : 0n;
}

/** Whether a request of `quote` fits a budget. */
export function fits(check: BudgetCheck, count: BudgetCount, quote: bigint): boolean {
  return count.spent + count.held + quote <= check.limit;
}

const RESERVATION_ID = /^rsv_[0-9A-Za-z]{20}_\{([A-Za-z0-9][A-Za-z0-9._:-]{0,127})\}$/;

/**
 * A fresh reservation id: `rsv_` + 20 random base62 characters + `_{accountId}`. The account's
 * hash tag in the id keeps the reservation next to its budgets in one Redis Cluster slot.
 */
export function newReservationId(accountId: string): string {
  return `rsv_${randomBase62(20)}_{${accountId}}`;
}

const LEASE_TICKET = /^(rsv_[0-9A-Za-z]{20}_\{[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\})~([1-9][0-9]{0,8})$/;

/**
 * The lease and ticket a reservation id names when a request was admitted on a lease
 * (`<lease id>~<n>`, docs/money.md, "Leases"); undefined for any other id.
 */
export function leaseTicketOf(id: string): { leaseId: string; ticket: number } | undefined {
  const m = LEASE_TICKET.exec(id);
  return m ? { leaseId: m[1]!, ticket: Number(m[2]) } : undefined;
}

/** Whether `id` has the shape newReservationId gives. */
export function isReservationId(id: string): boolean {
  return RESERVATION_ID.test(id);
}

/**
 * Turns a reservation into spend, at most once (see Ledger.settle). metering calls it for every
 * account-door usage event that carries a reservation id; an unknown id changes nothing.
 */
export async function settleReservation(
  ledger: Pick<Ledger, "settle">,
  input: { reservationId: string; cost: bigint; eventId: string },
  now = new Date(),
): Promise<Settlement> {
  if (input.reservationId === "") throw new AuthError("invalid_argument", "reservation_id is missing");
  if (input.cost < 0n) throw new AuthError("invalid_argument", "actual_cost must not be negative");
  return ledger.settle(input.reservationId, input.cost, input.eventId, now);
}

/** Most reservations one settleReservations call takes (SettleReservations). */
export const MAX_SETTLE_BATCH = 1_000;

/**
 * Settles many reservations, each exactly as settleReservation would, in the order given: the
 * batch entry point of metering, which settles the reservations of a whole batch of usage
 * events at once. An item that cannot be settled is answered by its error in its place (an
 * AuthError when it is invalid) and leaves the others settled, so the caller retries that item
 * only. A reservation id given twice is settled once (the second answers already_settled).
 */
export async function settleReservations(
  ledger: Pick<Ledger, "settle" | "settleMany">,
  items: readonly SettleItem[],
  now = new Date(),
): Promise<Array<Settlement | Error>> {
  if (items.length > MAX_SETTLE_BATCH) {
    throw new AuthError("invalid_argument", `at most ${MAX_SETTLE_BATCH} reservations per call`);
  }
  const results: Array<Settlement | Error | undefined> = items.map((item) => {
    if (item.reservationId === "") return new AuthError("invalid_argument", "reservation_id is missing");
    if (item.cost < 0n) return new AuthError("invalid_argument", "actual_cost must not be negative");
    return undefined;
  });
  const valid = items.filter((_, i) => results[i] === undefined);
  let settled: Array<Settlement | Error>;
  if (ledger.settleMany) {
    settled = valid.length > 0 ? await ledger.settleMany(valid, now) : [];
  } else {
    settled = [];
    for (const item of valid) {
      settled.push(
        await ledger
          .settle(item.reservationId, item.cost, item.eventId, now)
          .catch((err: unknown) => (err instanceof Error ? err : new Error(String(err)))),
      );
    }
  }
  let next = 0;
  return results.map((r) => r ?? settled[next++] ?? new Error("ledger answered too few settlements"));
}
