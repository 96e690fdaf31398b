import type { Redis } from "@tollgate/kit/redis";
import type { IdempotencyDecision, IdempotencyStore } from "../domain/idempotency.js";

// One script per step, so a check and its update are one atomic Redis operation.
const BEGIN = `
local fp = redis.call('HGET', KEYS[1], 'fp')
if not fp then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'running', 'owner', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'run'}
end
if fp ~= ARGV[1] then return {'conflict'} end
if redis.call('HGET', KEYS[1], 'state') == 'done' then
  return {'replay', redis.call('HGET', KEYS[1], 'status'), redis.call('HGET', KEYS[1], 'headers'), redis.call('HGET', KEYS[1], 'body')}
end
return {'in_progress'}`;

// A response is stored over its own running claim, or where no record is left (its claim
// lapsed and nobody took it over); never over a stored one or another request's claim.
const COMPLETE = `
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'owner')
if rec[1] and (rec[1] ~= ARGV[1] or rec[2] ~= 'running' or rec[3] ~= ARGV[6]) then return 0 end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'done', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4])
redis.call('HDEL', KEYS[1], 'owner')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1`;

// Only the owner's running claim is renewed or dropped.
const RENEW = `
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'owner')
if rec[1] == ARGV[1] and rec[2] == 'running' and rec[3] == ARGV[3] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`;

const ABANDON = `
local rec = redis.call('HMGET', KEYS[1], 'fp', 'state', 'owner')
if rec[1] == ARGV[1] and rec[2] == 'running' and rec[3] == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0`;

/** Idempotency records in Redis, shared by every api-edge replica. */
export function createRedisIdempotencyStore(redis: Redis, prefix: string): IdempotencyStore {
  const key = (id: string) => `${prefix}idem:${id}`;
  return {
    async begin(id, fingerprint, owner, leaseMs) {
      const r = (await redis.eval(BEGIN, 1, key(id), fingerprint, String(leaseMs), owner)) as Array<
        string | null
      >;
      const kind = r[0] as IdempotencyDecision["kind"];
      if (kind !== "replay") return { kind } as IdempotencyDecision;
      return {
        kind,
        response: {
          status: Number(r[1]),
          headers: JSON.parse(r[2] ?? "{}") as Record<string, string>,
          body: Buffer.from(r[3] ?? "", "base64"),
        },
      };
    },
    async complete(id, fingerprint, owner, response, ttlMs) {
      await redis.eval(
        COMPLETE,
        1,
        key(id),
        fingerprint,
        String(response.status),
        JSON.stringify(response.headers),
        response.body.toString("base64"),
        String(ttlMs),
        owner,
      );
    },
    async renew(id, fingerprint, owner, leaseMs) {
      await redis.eval(RENEW, 1, key(id), fingerprint, String(leaseMs), owner);
    },
    async abandon(id, fingerprint, owner) {
      await redis.eval(ABANDON, 1, key(id), fingerprint, owner);
    },
  };
}
