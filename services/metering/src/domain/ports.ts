import type { Granularity, PaidHold, UsageEvent, UsageFilter, UsageReport } from "./usage.js";

/** What recording one event did. */
export type RecordOutcome = "recorded" | "duplicate";

/** Where usage is applied and rolled up (hour and day buckets, UTC, per dimension combination). */
export interface UsageStore {
  /**
   * Applies one event exactly once: if its eventId was seen before nothing changes, else the
   * event is remembered and added to its hour and day buckets, all in one atomic step.
   */
  record(event: UsageEvent): Promise<RecordOutcome>;
  /**
   * Applies a batch of events, each exactly as record() would (an event id seen before, or
   * earlier in the same batch, is a duplicate), in one store round trip. An event that could
   * not be applied is answered by its Error in its place, having changed nothing; the others
   * stand. Rejects when nothing can be said of any event (the whole batch is then retried).
   */
  recordMany(events: readonly UsageEvent[]): Promise<Array<RecordOutcome | Error>>;
  /**
   * Sums the buckets overlapping [from, to) that match `filter`, one per period (or per period
   * and model with `byModel`); empty buckets are left out.
   */
  query(
    filter: UsageFilter,
    from: Date,
    to: Date,
    granularity: Granularity,
    byModel?: boolean,
  ): Promise<UsageReport>;
}

/** What became of a budget reservation when its usage was applied. */
export type SettlementOutcome = "settled" | "settled_after_expiry" | "already_settled" | "unknown";

/** One reservation to settle with the actual cost of its usage. */
export interface SettleItem {
  reservationId: string;
  cost: bigint;
  eventId: string;
}

/** Turns account-door budget reservations into spend (auth-policy's SettleReservations). */
export interface ReservationSettler {
  /**
   * Settles a batch of reservations with their actual costs in one call; idempotent by
   * reservation id, so a redelivered event settles nothing twice. An item that could not be
   * settled is answered by its Error in its place (that event alone is retried); rejects when
   * the call as a whole failed (every item is retried).
   */
  settleMany(items: readonly SettleItem[]): Promise<Array<SettlementOutcome | Error>>;
}

/**
 * What became of a paid-door hold committed from its usage event: charged (by this commit, or
 * already by api-edge's or an earlier delivery's: commits are idempotent by reservation id), or
 * never to be charged because mpp-payment does not know it, it was released, or it expired.
 */
export type PaidCommitOutcome = "committed" | "unknown" | "released" | "expired";

/** One paid hold to commit with the actual cost of its usage. */
export interface PaidCommitItem extends PaidHold {
  cost: bigint;
}

/**
 * Charges paid-door holds from their usage events (mpp-payment's Commit), beside api-edge's own
 * Commit after its answer: whichever lands first charges the cost, the other changes nothing
 * (docs/money.md, "Paid door: the commit after the answer").
 */
export interface PaidCommitter {
  /**
   * Commits one hold with its cost; resolves with what became of it (a hold committed before
   * is "committed" and charged nothing more). Rejects when the commit could not be done (no
   * replica or store answered, a timeout): the event is delivered again.
   */
  commit(item: PaidCommitItem): Promise<PaidCommitOutcome>;
}
