import { pipelined, type Redis } from "@tollgate/kit/redis";
import type { ResponseItemStore, StoredResponseItem } from "../domain/response-items.js";

/**
 * Responses output items in Redis, shared by every api-edge replica: one string key per item
 * that expires with it. A read of many is one pipeline (one per slot on a cluster).
 */
export function createRedisResponseItemStore(redis: Redis, prefix: string, ttlMs: number): ResponseItemStore {
  const key = (id: string) => `${prefix}item:${id}`;
  return {
    async put(id, item) {
      await redis.set(key(id), JSON.stringify(item), "PX", ttlMs);
    },
    async getMany(ids) {
      const keys = ids.map(key);
      const replies = await pipelined(
        redis,
        keys,
        (k) => k,
        (p, k) => p.get(k),
      );
      return replies.map(([err, value]) => {
        if (err) throw err;
        return typeof value === "string" ? (JSON.parse(value) as StoredResponseItem) : undefined;
      });
    },
  };
}
