import type { Redis } from "@tollgate/kit/redis";
import type { RateLimiter, WindowCount } from "../domain/ports.js";
import { BUCKET_MS, WINDOW_BUCKETS } from "../domain/rate-limit.js";

/** Options of the Redis rate limiter. */
export interface RedisRateLimiterOptions {
  /** Prefix of every key this limiter touches. Default "tollgate:". */
  prefix?: string;
  /**
   * "redis" (default) reads the clock of the Redis server, so every replica counts on one clock;
   * "caller" uses the `now` passed in (tests that move time).
   */
  clock?: "redis" | "caller";
}

// The sliding window of domain/rate-limit.ts (countWindow), for every window of one request in
// one atomic step: check all, and only if every window has room, count the request in each.
//   KEYS: one hash per window (field: bucket index = floor(ms / bucket ms), value: units)
//   ARGV: now ms ('' = Redis TIME), bucket ms, buckets per window, then limit, cost per window
//   Returns: admitted (0/1), now ms, then per window: used, newest bucket (-1 none), retry ms
//            (0 fits, -1 never)
const CONSUME_LUA = `
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local width = tonumber(ARGV[2])
local span = tonumber(ARGV[3])
local current = math.floor(now / width)
local oldest = current - span + 1
local admitted = 1
local out = {}
for i = 1, #KEYS do
  local limit = tonumber(ARGV[2 + 2 * i])
  local cost = tonumber(ARGV[3 + 2 * i])
  local flat = redis.call('HGETALL', KEYS[i])
  local live, stale = {}, {}
  local used, newest = 0, -1
  for j = 1, #flat, 2 do
    local b, units = tonumber(flat[j]), tonumber(flat[j + 1])
    if b < oldest then
      stale[#stale + 1] = flat[j]
    else
      live[#live + 1] = { b, units }
      used = used + units
      if units > 0 and b > newest then newest = b end
    end
  end
  if #stale > 0 then redis.call('HDEL', KEYS[i], unpack(stale)) end
  local retry = 0
  if used + cost > limit then
    admitted = 0
    retry = -1
    if cost <= limit then
      table.sort(live, function(x, y) return x[1] < y[1] end)
      local freed = 0
      for _, e in ipairs(live) do
        freed = freed + e[2]
        if used - freed + cost <= limit then
          retry = (e[1] + span) * width - now
          break
        end
      end
    end
  end
  out[#out + 1] = used
  out[#out + 1] = newest
  out[#out + 1] = retry
end
if admitted == 1 then
  for i = 1, #KEYS do
    local cost = tonumber(ARGV[3 + 2 * i])
    if cost > 0 then
      redis.call('HINCRBY', KEYS[i], current, cost)
      redis.call('PEXPIRE', KEYS[i], (span + 1) * width)
    end
  end
end
table.insert(out, 1, now)
table.insert(out, 1, admitted)
return out
`;

type WithConsume = Redis & {
  authRateConsume(numKeys: number, ...args: Array<string | number>): Promise<number[]>;
};

/**
 * Rate-limit counters in Redis, correct across replicas: one Lua script per Authorize checks
 * every window and counts the request only if all admit it.
 */
export function createRedisRateLimiter(redis: Redis, opts: RedisRateLimiterOptions = {}): RateLimiter {
  const prefix = `${opts.prefix ?? "tollgate:"}auth:rl:`;
  const client = redis as WithConsume;
  if (typeof client.authRateConsume !== "function") {
    // No fixed key count: the first argument of each call says how many keys follow.
    client.defineCommand("authRateConsume", { lua: CONSUME_LUA });
  }
  return {
    async consume(windows, now) {
      if (windows.length === 0) return { admitted: true, nowMs: now.getTime(), counts: [] };
      const reply = await client.authRateConsume(
        windows.length,
        ...windows.map((w) => prefix + w.id),
        opts.clock === "caller" ? now.getTime() : "",
        BUCKET_MS,
        WINDOW_BUCKETS,
        ...windows.flatMap((w) => [w.limit, w.cost]),
      );
      const counts: WindowCount[] = windows.map((_, i) => ({
        used: Number(reply[2 + 3 * i]),
        newestBucket: Number(reply[3 + 3 * i]),
        retryAfterMs: Number(reply[4 + 3 * i]),
      }));
      return { admitted: reply[0] === 1, nowMs: Number(reply[1]), counts };
    },
  };
}
