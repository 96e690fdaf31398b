import type { Granularity, UsageEvent, UsageFilter, UsageReport } from "./usage.js";

/** Where usage is applied and rolled up (hour and day buckets, UTC, per dimension combination). */
export interface UsageStore {
  /**
   * Applies one event exactly once: if its eventId was seen before nothing changes, else the
   * event is remembered and added to its hour and day buckets, all in one atomic step.
   */
  record(event: UsageEvent): Promise<"recorded" | "duplicate">;
  /** Sums the buckets overlapping [from, to) that match `filter`; empty buckets are left out. */
  query(filter: UsageFilter, from: Date, to: Date, granularity: Granularity): Promise<UsageReport>;
}

/** What became of a budget reservation when its usage was applied. */
export type SettlementOutcome = "settled" | "settled_after_expiry" | "already_settled" | "unknown";

/** Turns account-door budget reservations into spend (auth-policy's SettleReservation). */
export interface ReservationSettler {
  /**
   * Settles a reservation with the actual cost; idempotent by reservation id, so a redelivered
   * event settles nothing twice. Rejects when it could not be done (the event is then retried).
   */
  settle(reservationId: string, cost: bigint, eventId: string): Promise<SettlementOutcome>;
}
