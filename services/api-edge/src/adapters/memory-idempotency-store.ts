import type { IdempotencyStore, StoredResponse } from "../domain/idempotency.js";

type Entry = { fingerprint: string; expiresAt: number; response?: StoredResponse };

/** Idempotency records in this process's memory (the all-in-one process without Redis). */
export function createMemoryIdempotencyStore(now: () => number = Date.now): IdempotencyStore {
  const entries = new Map<string, Entry>();
  const live = (id: string) => {
    const e = entries.get(id);
    if (e && e.expiresAt <= now()) {
      entries.delete(id);
      return undefined;
    }
    return e;
  };
  return {
    async begin(id, fingerprint, leaseMs) {
      const e = live(id);
      if (!e) {
        entries.set(id, { fingerprint, expiresAt: now() + leaseMs });
        return { kind: "run" };
      }
      if (e.fingerprint !== fingerprint) return { kind: "conflict" };
      return e.response ? { kind: "replay", response: e.response } : { kind: "in_progress" };
    },
    async complete(id, fingerprint, response, ttlMs) {
      entries.set(id, { fingerprint, response, expiresAt: now() + ttlMs });
    },
    async abandon(id, fingerprint) {
      const e = live(id);
      if (e && !e.response && e.fingerprint === fingerprint) entries.delete(id);
    },
  };
}
