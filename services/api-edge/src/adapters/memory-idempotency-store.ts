import type { IdempotencyStore, StoredResponse } from "../domain/idempotency.js";

type Entry = { fingerprint: string; owner: string; expiresAt: number; response?: StoredResponse };

/** How often the records past their time to live are dropped, at most. */
const SWEEP_EVERY_MS = 60_000;

/** The memory idempotency store, and what it holds (for tests of its memory). */
export interface MemoryIdempotencyStore extends IdempotencyStore {
  retained(): { records: number };
}

/**
 * Idempotency records in this process's memory (the all-in-one process without Redis). A record
 * is dropped once its time to live has passed, even if its key is never sent again.
 */
export function createMemoryIdempotencyStore(now: () => number = Date.now): MemoryIdempotencyStore {
  const entries = new Map<string, Entry>();
  let nextSweep = now() + SWEEP_EVERY_MS;
  // Drops every expired record, once a minute at most: O(records) a minute, not a request.
  const sweep = (at: number) => {
    if (at < nextSweep) return;
    nextSweep = at + SWEEP_EVERY_MS;
    for (const [id, e] of entries) if (e.expiresAt <= at) entries.delete(id);
  };
  const live = (id: string) => {
    const at = now();
    sweep(at);
    const e = entries.get(id);
    if (e && e.expiresAt <= at) {
      entries.delete(id);
      return undefined;
    }
    return e;
  };
  return {
    retained: () => ({ records: entries.size }),
    async begin(id, fingerprint, owner, leaseMs) {
      const e = live(id);
      if (!e) {
        entries.set(id, { fingerprint, owner, expiresAt: now() + leaseMs });
        return { kind: "run" };
      }
      if (e.fingerprint !== fingerprint) return { kind: "conflict" };
      return e.response ? { kind: "replay", response: e.response } : { kind: "in_progress" };
    },
    async complete(id, fingerprint, owner, response, ttlMs) {
      const e = live(id);
      if (e && (e.response || e.owner !== owner || e.fingerprint !== fingerprint)) return;
      entries.set(id, { fingerprint, owner, response, expiresAt: now() + ttlMs });
    },
    async renew(id, fingerprint, owner, leaseMs) {
      const e = live(id);
      if (e && !e.response && e.fingerprint === fingerprint && e.owner === owner)
        e.expiresAt = now() + leaseMs;
    },
    async abandon(id, fingerprint, owner) {
      const e = live(id);
      if (e && !e.response && e.fingerprint === fingerprint && e.owner === owner) entries.delete(id);
    },
  };
}
