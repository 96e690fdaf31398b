import { type Redis, scanStream } from "@tollgate/kit/redis";

/** Every key matching the SCAN pattern `match`, on every master of a cluster. */
export async function keysMatching(redis: Redis, match: string): Promise<string[]> {
  const keys: string[] = [];
  for await (const batch of scanStream(redis, { match, count: 500 })) keys.push(...batch);
  return keys;
}

/** Deletes every key matching `match`: what a test wrote under its own namespace, after it. */
export async function deleteMatching(redis: Redis, match: string): Promise<void> {
  const keys = await keysMatching(redis, match);
  // One DEL per key: on a cluster the keys of one namespace live in many slots.
  await Promise.all(keys.map((k) => redis.del(k)));
}
