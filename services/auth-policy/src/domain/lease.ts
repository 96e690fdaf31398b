// Leases (docs/money.md, "Leases"): an allowance of budget and rate-limit units granted to one
// api-edge replica for a short while, so that it admits the requests of one key, route, model
// and cap itself instead of asking for each one. A lease's budget allowance is a hold in the
// ledger like a reservation's (its id is a reservation id); its units are taken from the shared
// windows at once. Each replica gets at most half of what is left, so two replicas, or two
// shapes of one key, never starve each other and the last part of a budget or a window is
// always admitted one request at a time by authorize(), exactly.

import {
  type Authorization,
  type AuthorizeDeps,
  type AuthorizeInput,
  budgetsLeft,
  checkPolicy,
} from "./authorize.js";
import { newReservationId } from "./budget.js";
import { AuthError } from "./errors.js";
import type { LeaseReturn, Ledger, RateWindow } from "./ports.js";
import { type RateLimitStatus, settle } from "./rate-limit.js";
import type { BudgetCheck, BudgetCount } from "./types.js";

/** Most requests one lease may be asked to cover. */
export const MAX_LEASE_REQUESTS = 1_000;
/**
 * How long a replica admits requests on one lease, in ms: also the bound on how long a revoked
 * key, or a changed policy, can still be admitted by a replica that holds a lease for it.
 */
export const LEASE_USE_MS = 1_000;
/** The share of what is left of a budget or a window one lease may take: one half. */
const SHARE = 2n;

/** What one lease grants, when it was granted. */
export interface LeaseGrant {
  /** The reservation holding the budget allowance and naming the windows; "" when none is needed. */
  leaseId: string;
  /** Base units held for the lease's requests; undefined when no budget applies. */
  budget?: bigint;
  /** Units taken from every requests window; undefined when none applies. */
  requests?: number;
  /** Units taken from every tokens window; undefined when none applies. */
  tokens?: number;
}

/** The outcome of acquireLease: the request's policy verdict, and a lease or none. */
export interface LeaseOutcome {
  /** What authorize() would answer, without the request's hold: budgets left after the lease's. */
  verdict: Authorization;
  /** Absent: a budget or a window is too close to its end; authorize() each request. */
  lease?: LeaseGrant;
}

/** What is left of each budget and window, and what one request takes of them. */
export interface LeaseRoom {
  /** Per budget: its limit and counts. */
  budgets: ReadonlyArray<{ check: BudgetCheck; count: BudgetCount }>;
  /** Per window: its limit, its units used, and this request's units. */
  windows: ReadonlyArray<{ window: RateWindow; used: number }>;
  /** One request's quote; undefined when the request has none (no budget can apply). */
  quote?: bigint;
  /** How many requests like this one are wanted. */
  wanted: number;
}

/**
 * How large a lease is: for `wanted` requests of this size, but never more than half of what is
 * left of any budget or window; none when that half does not cover one request. Pure.
 */
export function leaseSize(room: LeaseRoom): Omit<LeaseGrant, "leaseId"> | undefined {
  const wanted = BigInt(Math.min(Math.max(1, Math.floor(room.wanted)), MAX_LEASE_REQUESTS));
  const grant: Omit<LeaseGrant, "leaseId"> = {};
  if (room.budgets.length > 0) {
    if (room.quote === undefined) return undefined;
    let budget = wanted * room.quote;
    for (const { check, count } of room.budgets) {
      const left = check.limit - count.spent - count.held;
      const half = left > 0n ? left / SHARE : 0n;
      if (half < budget) budget = half;
    }
    if (budget < room.quote) return undefined;
    grant.budget = budget;
  }
  for (const { window, used } of room.windows) {
    const half = BigInt(Math.max(0, window.limit - used)) / SHARE;
    const want = wanted * BigInt(window.cost);
    const units = Number(half < want ? half : want);
    if (units < window.cost) return undefined;
    const unit = window.unit;
    grant[unit] = Math.min(grant[unit] ?? units, units);
  }
  return grant;
}

/**
 * Checks a request exactly as authorize() does (the same refusals, in the same order, for its
 * key and policy) and grants a lease for `wanted` requests like it: the budgets and windows are
 * read, the lease sized (leaseSize), then held and counted in one atomic step, which refuses if
 * another replica took the room in between (then no lease). Takes nothing without a lease.
 */
export async function acquireLease(
  deps: AuthorizeDeps,
  input: AuthorizeInput,
  wanted: number,
  now = new Date(),
): Promise<LeaseOutcome> {
  if (input.checkOnly) throw new AuthError("invalid_argument", "a lease is never for a check only");
  if (input.route === "models") throw new AuthError("invalid_argument", "the models route takes no lease");
  const checked = await checkPolicy(deps, input, now);
  if (checked.checkOnly) throw new AuthError("invalid_argument", "a lease is never for a check only");
  const { base, model, cap, windows, quote, checks, record } = checked;
  const verdict: Authorization = {
    ...base,
    model,
    ...(cap !== undefined ? { maxOutputTokens: cap } : {}),
    ...(quote !== undefined ? { quote } : {}),
  };
  if (windows.length === 0 && checks.length === 0) return { verdict, lease: { leaseId: "" } };
  if (checks.length > 0 && quote === undefined) {
    throw new Error(`model '${model}' has no prices; cannot check its budget`);
  }
  const seen = await deps.ledger.admit(
    windows.map((w) => ({ ...w, cost: 0 })),
    checks.length > 0 ? { peek: checks } : undefined,
    now,
  );
  const size = leaseSize({
    budgets: checks.map((check, i) => ({ check, count: seen.budgets[i] ?? { spent: 0n, held: 0n } })),
    windows: windows.map((window, i) => ({ window, used: seen.counts[i]?.used ?? 0 })),
    ...(quote !== undefined ? { quote } : {}),
    wanted,
  });
  if (!size) return { verdict };
  const leaseId = newReservationId(record.accountId);
  const taken = windows.map((w) => ({ ...w, cost: size[w.unit] ?? 0 }));
  const decision = await deps.ledger.admit(
    taken,
    { hold: { reservationId: leaseId, amount: size.budget ?? 0n, budgets: checks, lease: true } },
    now,
  );
  if (!decision.admitted) return { verdict };
  const rateLimit: RateLimitStatus | undefined =
    taken.length > 0 ? settle(taken, { ...decision, admitted: true }) : undefined;
  return {
    verdict: {
      ...verdict,
      ...(rateLimit ? { rateLimit } : {}),
      ...budgetsLeft(checks, decision.budgets, size.budget ?? 0n),
    },
    lease: { leaseId, ...size },
  };
}

/** Ends a lease (Ledger.returnLease); a negative amount is refused. */
export async function returnLease(
  ledger: Pick<Ledger, "returnLease">,
  leaseId: string,
  back: LeaseReturn,
  now = new Date(),
): Promise<{ released: bigint }> {
  if (leaseId === "") throw new AuthError("invalid_argument", "lease_id is missing");
  if (back.committed < 0n) throw new AuthError("invalid_argument", "committed must not be negative");
  return ledger.returnLease(leaseId, back, now);
}
