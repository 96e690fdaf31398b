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
