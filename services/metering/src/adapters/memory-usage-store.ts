import { ExpiringIds } from "@tollgate/kit/memory-window";
import type { RecordOutcome, UsageStore } from "../domain/ports.js";
import {
  addTotals,
  bucketStart,
  bucketStarts,
  dimensionsKey,
  type Granularity,
  parseDimensionsKey,
  reportOf,
  totalsOf,
  type UsageEvent,
  type UsageTotals,
} from "../domain/usage.js";

/** Options of the in-memory store. */
export interface MemoryUsageStoreOptions {
  /** How long an applied event id is remembered; the Redis store's default too. */
  eventTtlMs?: number;
  now?: () => number;
}

/** The in-memory store, and what it holds (for tests of its memory). */
export interface MemoryUsageStore extends UsageStore {
  /** Event ids remembered for the dedupe window. */
  retained(): { eventIds: number };
}

const GRANULARITIES: readonly Granularity[] = ["hour", "day"];

/**
 * The usage store of the all-in-one process without Redis and of unit tests. It has the
 * Redis store's semantics; record() is atomic because it never awaits between check and update.
 */
export function createMemoryUsageStore(opts: MemoryUsageStoreOptions = {}): MemoryUsageStore {
  const ttlMs = opts.eventTtlMs ?? 7 * 24 * 3_600_000;
  const now = opts.now ?? Date.now;
  // The event ids applied within their time to live.
  const seen = new ExpiringIds(ttlMs);
  // "hour:<start ms>" → dimensions key → totals
  const buckets = new Map<string, Map<string, UsageTotals>>();

  const store: MemoryUsageStore = {
    retained: () => ({ eventIds: seen.size }),
    async recordMany(events) {
      return events.map((e) => recordNow(e));
    },

    async record(event) {
      return recordNow(event);
    },

    async query(filter, from, to, granularity, byModel = false) {
      const rows = bucketStarts(from, to, granularity).flatMap((start) =>
        [...(buckets.get(`${granularity}:${start.getTime()}`) ?? [])].map(([dims, totals]) => ({
          start,
          dims: parseDimensionsKey(dims),
          totals,
        })),
      );
      return reportOf(rows, filter, byModel);
    },
  };
  return store;

  // Synchronous, so each event's check and update are one atomic step.
  function recordNow(event: UsageEvent): RecordOutcome {
    if (!seen.add(event.eventId, now())) return "duplicate";
    const dims = dimensionsKey(event);
    const add = totalsOf(event);
    for (const g of GRANULARITIES) {
      const id = `${g}:${bucketStart(event.occurredAt, g).getTime()}`;
      const bucket = buckets.get(id) ?? new Map<string, UsageTotals>();
      buckets.set(id, bucket);
      const before = bucket.get(dims);
      bucket.set(dims, before ? addTotals(before, add) : add);
    }
    return "recorded";
  }
}
