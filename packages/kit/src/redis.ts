import { Redis } from "ioredis";
import type { HealthCheck } from "./health.js";

export type { Redis } from "ioredis";

/**
 * Connects to Redis by URL. Commands fail fast while Redis is unreachable, so a request fails
 * in milliseconds (503) instead of hanging until a reconnect: commands issued before the first
 * connection wait for it, but once connected a command sent while disconnected is refused at
 * once (no offline queue), and a command in flight when the connection drops is rejected, never
 * resent on the next connection (its effect is unknown; resending a Lua script could apply it
 * twice). Reconnects go on forever, at most 500 ms apart. `name` (the service) is the
 * connection's CLIENT SETNAME, so `CLIENT LIST` shows who is who.
 */
export function connectRedis(url: string, name?: string): Redis {
  const redis = new Redis(url, {
    ...(name ? { connectionName: name } : {}),
    maxRetriesPerRequest: 0,
    enableOfflineQueue: true,
    autoResendUnfulfilledCommands: false,
    connectTimeout: 2_000,
    retryStrategy: (times) => Math.min(50 * 2 ** times, 500),
  });
  redis.once("ready", () => {
    redis.options.enableOfflineQueue = false;
  });
  return redis;
}

const UNAVAILABLE_MESSAGES = [
  "Stream isn't writeable",
  "Connection is closed",
  "Reached the max retries per request limit",
  "LOADING ",
  "connect ECONNREFUSED",
  "connect ETIMEDOUT",
  "read ECONNRESET",
  "write EPIPE",
];

/**
 * Whether an error means Redis could not be reached (down, restarting, loading its data) rather
 * than a command being wrong: the caller should answer "unavailable, retry" (gRPC UNAVAILABLE,
 * HTTP 503), and a consumer should not acknowledge what it could not apply.
 */
export function isRedisUnavailable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  return UNAVAILABLE_MESSAGES.some((m) => err.message.startsWith(m));
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
