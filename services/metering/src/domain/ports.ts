import type { Granularity, UsageEvent, UsageFilter, UsageReport } from "./usage.js";

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
