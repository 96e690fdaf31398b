import type { RateLimiter, WindowCount } from "../domain/ports.js";
import { BUCKET_MS, countWindow, WINDOW_BUCKETS } from "../domain/rate-limit.js";

/**
 * Rate-limit counters in this process's memory, for the all-in-one process without REDIS_URL:
 * the same sliding window over one-second buckets as the Redis limiter, on the caller's clock.
 */
export function createMemoryRateLimiter(): RateLimiter {
  const windows = new Map<string, Map<number, number>>();
  return {
    async consume(list, now) {
      const nowMs = now.getTime();
      const current = Math.floor(nowMs / BUCKET_MS);
      const counts: WindowCount[] = [];
      let admitted = true;
      for (const w of list) {
        const buckets = windows.get(w.id) ?? new Map<number, number>();
        // Forget what no window can see any more.
        for (const b of buckets.keys()) if (b <= current - WINDOW_BUCKETS) buckets.delete(b);
        if (buckets.size === 0) windows.delete(w.id);
        const count = countWindow(buckets, w.limit, w.cost, nowMs);
        if (count.retryAfterMs !== 0) admitted = false;
        counts.push(count);
      }
      if (admitted) {
        for (const w of list) {
          if (w.cost === 0) continue;
          const buckets = windows.get(w.id) ?? new Map<number, number>();
          buckets.set(current, (buckets.get(current) ?? 0) + w.cost);
          windows.set(w.id, buckets);
        }
      }
      return { admitted, nowMs, counts };
    },
  };
}
