import type { ResponseItemStore, StoredResponseItem } from "../domain/response-items.js";

type Entry = { item: StoredResponseItem; expiresAt: number };

/** The memory item store, and what it holds (for tests of its memory). */
export interface MemoryResponseItemStore extends ResponseItemStore {
  retained(): { items: number };
}

/** Default bound of the items one process keeps; the oldest go first beyond it. */
export const MEMORY_RESPONSE_ITEMS_MAX = 10_000;

/**
 * Responses output items in this process's memory (the all-in-one process without Redis), at
 * most `maxItems` of them, each for `ttlMs`. Every item lives as long, so insertion order is
 * expiry order: the expired and the overflow are dropped from the front, O(1) per item.
 */
export function createMemoryResponseItemStore(
  ttlMs: number,
  maxItems: number = MEMORY_RESPONSE_ITEMS_MAX,
  now: () => number = Date.now,
): MemoryResponseItemStore {
  const entries = new Map<string, Entry>();
  const forget = (at: number) => {
    for (const [id, e] of entries) {
      if (e.expiresAt > at && entries.size <= maxItems) break;
      entries.delete(id);
    }
  };
  return {
    retained: () => ({ items: entries.size }),
    async put(id, item) {
      const at = now();
      // Re-inserted, so the map's order stays the expiry order.
      entries.delete(id);
      entries.set(id, { item, expiresAt: at + ttlMs });
      forget(at);
    },
    async getMany(ids) {
      const at = now();
      forget(at);
      return ids.map((id) => entries.get(id)?.item);
    },
  };
}
