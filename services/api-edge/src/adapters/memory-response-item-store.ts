import type { ResponseItemStore, StoredResponseItem } from "../domain/response-items.js";

type Entry = { item: StoredResponseItem; expiresAt: number; bytes: number };

/** The memory item store, and what it holds (for tests of its memory). */
export interface MemoryResponseItemStore extends ResponseItemStore {
  retained(): { items: number; bytes: number };
}

/** Default bounds of what one process keeps; the oldest items go first beyond either. */
export const MEMORY_RESPONSE_ITEMS_MAX = { items: 10_000, bytes: 64 * 1024 * 1024 };

/**
 * Responses output items in this process's memory (the all-in-one process without Redis), each
 * for `ttlMs`, at most `max.items` of them and `max.bytes` of text. ExpiringIds keeps ids only;
 * these carry their text, so a Map: every item lives as long, so insertion order is expiry
 * order, and the expired and the overflow are dropped from the front, O(1) per item.
 */
export function createMemoryResponseItemStore(
  ttlMs: number,
  max: { items: number; bytes: number } = MEMORY_RESPONSE_ITEMS_MAX,
  now: () => number = Date.now,
): MemoryResponseItemStore {
  const entries = new Map<string, Entry>();
  let bytes = 0;
  const drop = (id: string, e: Entry) => {
    entries.delete(id);
    bytes -= e.bytes;
  };
  const forget = (at: number) => {
    for (const [id, e] of entries) {
      if (e.expiresAt > at && entries.size <= max.items && bytes <= max.bytes) break;
      drop(id, e);
    }
  };
  return {
    retained: () => ({ items: entries.size, bytes }),
    async put(id, item) {
      const at = now();
      const old = entries.get(id);
      // Re-inserted, so the map's order stays the expiry order.
      if (old) drop(id, old);
      const entry = { item, expiresAt: at + ttlMs, bytes: Buffer.byteLength(item.text) };
      entries.set(id, entry);
      bytes += entry.bytes;
      forget(at);
    },
    async getMany(ids) {
      const at = now();
      forget(at);
      return ids.map((id) => entries.get(id)?.item);
    },
  };
}
