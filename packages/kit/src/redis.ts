import { Redis } from "ioredis";
import type { HealthCheck } from "./health.js";

export type { Redis } from "ioredis";

/**
 * Connects to Redis by URL. Commands fail fast while disconnected instead of queueing forever.
 * `name` (the service) is the connection's CLIENT SETNAME, so `CLIENT LIST` shows who is who.
 */
export function connectRedis(url: string, name?: string): Redis {
  return new Redis(url, {
    ...(name ? { connectionName: name } : {}),
    maxRetriesPerRequest: 1,
    enableOfflineQueue: true,
    connectTimeout: 2_000,
    retryStrategy: (times) => Math.min(50 * 2 ** times, 2_000),
  });
}

/** A readiness check that PINGs Redis. */
export function redisHealth(redis: Redis): HealthCheck {
  return { name: "redis", check: async () => void (await redis.ping()) };
}

/** Closes a Redis connection, waiting for pending replies. */
export async function quitRedis(redis: Redis): Promise<void> {
  if (redis.status === "end") return;
  await redis.quit().catch(() => redis.disconnect());
}
