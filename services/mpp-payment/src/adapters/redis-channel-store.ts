import { isRedisUnavailable, type Redis } from "@tollgate/kit/redis";
import { retrying } from "@tollgate/kit/retry";
import type { Address, Hex } from "viem";
import type {
  ChallengeUse,
  ChannelRecord,
  ChannelStatus,
  ChannelStore,
  CommitOutcome,
  OfferVoucherOutcome,
  ReleaseOutcome,
  ReserveOutcome,
} from "../domain/ports.js";

/** Options of the Redis store. */
export interface RedisChannelStoreOptions {
  /** Prefix of every key this store touches. Default "tollgate:". */
  prefix?: string;
  /** How long a finished reservation is remembered for idempotent commit and release. Default 24 h. */
  reservationRetentionMs?: number;
}

// Key layout (P = prefix + "mpp:"; {id} is the lowercase channel id, braced as a cluster hash tag
// so that every key of one channel lives in one slot and one script can touch them all):
//   P ch:{id}            hash: descriptor (payer payee operator token salt signer enh), deposit,
//                        settled, highest + sig (the accepted voucher), spent, held, units,
//                        status (open|closing|closed), closingAt, closeTx/closeCum/closeCaptured
//   P ch:{id}:holds      hash: reservation id → held amount
//   P ch:{id}:exp        zset: reservation id scored by its expiry (ms)
//   P ch:{id}:vouchers   hash: cumulative → signature, every accepted voucher above settled
//   P res:{id}:<rid>     hash: amount, state (held|committed|released|expired), expiry and the
//                        committed figures; expires (PEXPIREAT) after the retention period
//   P used:{id}:<cid>    string: the reservation id whose hold consumed challenge <cid>
//                        (docs/paid-door.md, "One challenge, one request"); expires
//                        (PEXPIREAT) when the challenge can no longer be presented
//   P dirty              set: channels whose spend may be unsettled (settlement worker)
//   P lock:<name>        string: lease owner, with a TTL
// Amounts are decimal strings; scripts compare them with tonumber (exact up to 2^53, the
// domain's MAX_AMOUNT) and add them with HINCRBY (exact int64), never through Lua number
// formatting.

/** Drops expired holds of one channel: every script runs it before reading `held`. */
const SWEEP = `
local function sweep(ch, holds, exps, now)
  local ids = redis.call('ZRANGEBYSCORE', exps, '-inf', now)
  for _, id in ipairs(ids) do
    local amount = redis.call('HGET', holds, id)
    if amount then
      redis.call('HINCRBY', ch, 'held', '-' .. amount)
      redis.call('HDEL', holds, id)
    end
    redis.call('ZREM', exps, id)
  end
end
`;

/**
 * Holds ARGV[2] under reservation id ARGV[1] inside the accepted cumulative (highest − spent −
 * held), until ARGV[4]; its record is forgotten at ARGV[5]. KEYS: ch, holds, exps, res. With
 * `usedUntil` ('' for none), the hold pays under the challenge whose used mark is `used`: a mark
 * naming another reservation answers 'used' and holds nothing; a hold taken sets the mark to
 * ARGV[1] until `usedUntil`, in the same step.
 */
const RESERVE = `
local function reserve(KEYS, ARGV, used, usedUntil)
  if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown'} end
  if usedUntil ~= '' then
    local by = redis.call('GET', used)
    if by and by ~= ARGV[1] then return {'used'} end
  end
  local function mark()
    if usedUntil ~= '' then
      redis.call('SET', used, ARGV[1])
      redis.call('PEXPIREAT', used, usedUntil)
    end
  end
  sweep(KEYS[1], KEYS[2], KEYS[3], ARGV[3])
  local c = redis.call('HMGET', KEYS[1], 'status', 'highest', 'spent', 'held', 'units')
  local state = redis.call('HGET', KEYS[4], 'state')
  if state then
    if state == 'held' and redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
      mark()
      return {'reserved', c[3], c[2], c[5]}
    end
    return {'conflict'}
  end
  if c[1] ~= 'open' then return {'not_open'} end
  if tonumber(ARGV[2]) > tonumber(c[2]) - tonumber(c[3]) - tonumber(c[4]) then return {'insufficient'} end
  redis.call('HINCRBY', KEYS[1], 'held', ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  redis.call('HSET', KEYS[4], 'amount', ARGV[2], 'state', 'held', 'exp', ARGV[4])
  redis.call('PEXPIREAT', KEYS[4], ARGV[5])
  mark()
  return {'reserved', c[3], c[2], c[5]}
end
`;

/**
 * Offers voucher `cum` (decimal) with signature `sig` to channel `ch`; `checked` is '1' when its
 * signature was verified, `chainDeposit` and `chainSettled` the chain's figures. Answers
 * 'accepted' (raised: the voucher, the vouchers hash and the deposit updated), 'same', or why
 * nothing changed: unknown, not_open, unchecked, stale, settled, above_deposit.
 */
const OFFER = `
local function offer(ch, vouchers, cum, sig, checked, chainDeposit, chainSettled)
  local c = redis.call('HMGET', ch, 'status', 'highest', 'sig', 'deposit', 'settled')
  if not c[1] then return 'unknown' end
  if c[1] ~= 'open' then return 'not_open' end
  if checked ~= '1' and (c[2] ~= cum or string.lower(c[3] or '') ~= string.lower(sig)) then
    return 'unchecked'
  end
  local n, highest = tonumber(cum), tonumber(c[2])
  if n < highest then return 'stale' end
  if n == highest then return 'same' end
  if n <= math.max(tonumber(c[5]), tonumber(chainSettled)) then return 'settled' end
  if n > math.max(tonumber(c[4]), tonumber(chainDeposit)) then return 'above_deposit' end
  redis.call('HSET', ch, 'highest', cum, 'sig', sig)
  if tonumber(chainDeposit) > tonumber(c[4]) then redis.call('HSET', ch, 'deposit', chainDeposit) end
  redis.call('HSET', vouchers, cum, sig)
  return 'accepted'
end
`;

const SCRIPTS = {
  // KEYS: ch, vouchers. ARGV: payer payee operator token salt signer enh deposit settled cum sig
  mppCreateChannel: {
    keys: 2,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'payer', ARGV[1], 'payee', ARGV[2], 'operator', ARGV[3], 'token', ARGV[4],
  'salt', ARGV[5], 'signer', ARGV[6], 'enh', ARGV[7], 'deposit', ARGV[8], 'settled', ARGV[9],
  'highest', ARGV[10], 'sig', ARGV[11], 'spent', '0', 'held', '0', 'units', '0', 'status', 'open',
  'closingAt', '0')
redis.call('HSET', KEYS[2], ARGV[10], ARGV[11])
return 1
`,
  },
  // KEYS: ch. ARGV: deposit
  mppRaiseDeposit: {
    keys: 1,
    lua: `
local d = redis.call('HGET', KEYS[1], 'deposit')
if d and tonumber(ARGV[1]) > tonumber(d) then redis.call('HSET', KEYS[1], 'deposit', ARGV[1]) end
return 1
`,
  },
  // KEYS: ch, holds, exps, res, used. ARGV: rid, amount, now, expiresAt, forgetAt, usedUntil
  // ('' for no challenge)
  mppReserve: {
    keys: 5,
    lua: `${SWEEP}${RESERVE}
return reserve(KEYS, ARGV, KEYS[5], ARGV[6])
`,
  },
  // KEYS: ch, holds, exps, res, vouchers, used. ARGV: rid ('' for no hold), amount, now,
  // expiresAt, forgetAt, cumulative, signature, checked ('1' or '0'), chainDeposit, chainSettled,
  // usedUntil ('' for no challenge)
  mppOfferVoucher: {
    keys: 6,
    lua: `${SWEEP}${RESERVE}${OFFER}
local kind = offer(KEYS[1], KEYS[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
if kind ~= 'accepted' and kind ~= 'same' then return {kind} end
local held = ''
if ARGV[1] ~= '' then held = reserve(KEYS, ARGV, KEYS[6], ARGV[11])[1] end
local c = redis.call('HMGET', KEYS[1], 'highest', 'spent', 'units')
return {kind, c[1], c[2], c[3], held}
`,
  },
  // KEYS: ch, holds, exps, res. ARGV: rid, actual, now, forgetAt
  mppCommit: {
    keys: 4,
    lua: `${SWEEP}
local r = redis.call('HMGET', KEYS[4], 'state', 'spentAfter', 'acceptedAfter', 'unitsAfter', 'at', 'charged')
if not r[1] then return {'unknown'} end
if r[1] == 'committed' then return {'committed', r[2], r[3], r[4], r[5], r[6]} end
if r[1] ~= 'held' then return {r[1]} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown'} end
sweep(KEYS[1], KEYS[2], KEYS[3], ARGV[3])
local hold = redis.call('HGET', KEYS[2], ARGV[1])
if not hold then
  redis.call('HSET', KEYS[4], 'state', 'expired')
  return {'expired'}
end
local charge = ARGV[2]
if tonumber(charge) > tonumber(hold) then charge = hold end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'held', '-' .. hold)
redis.call('HINCRBY', KEYS[1], 'spent', charge)
redis.call('HINCRBY', KEYS[1], 'units', 1)
local c = redis.call('HMGET', KEYS[1], 'spent', 'highest', 'units')
redis.call('HSET', KEYS[4], 'state', 'committed', 'charged', charge, 'spentAfter', c[1],
  'acceptedAfter', c[2], 'unitsAfter', c[3], 'at', ARGV[3])
redis.call('PEXPIREAT', KEYS[4], ARGV[4])
return {'committed', c[1], c[2], c[3], ARGV[3], charge}
`,
  },
  // KEYS: ch, holds, exps, res. ARGV: rid, forgetAt
  mppRelease: {
    keys: 4,
    lua: `
local state = redis.call('HGET', KEYS[4], 'state')
if not state then return 'unknown' end
if state == 'committed' then return 'committed' end
if state == 'released' then return 'released_before' end
if state == 'expired' then return 'expired' end
local hold = redis.call('HGET', KEYS[2], ARGV[1])
if hold then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'held', '-' .. hold)
end
redis.call('HSET', KEYS[4], 'state', 'released')
redis.call('PEXPIREAT', KEYS[4], ARGV[2])
return 'released'
`,
  },
  // KEYS: ch, holds, exps. ARGV: now, staleAfterMs
  mppBeginClose: {
    keys: 3,
    lua: `${SWEEP}
local c = redis.call('HMGET', KEYS[1], 'status', 'closingAt')
if not c[1] then return 'unknown' end
if c[1] == 'closed' then return 'closed' end
if c[1] == 'closing' and tonumber(ARGV[1]) - tonumber(c[2]) < tonumber(ARGV[2]) then return 'closing' end
sweep(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
if tonumber(redis.call('HGET', KEYS[1], 'held')) > 0 then return 'busy' end
redis.call('HSET', KEYS[1], 'status', 'closing', 'closingAt', ARGV[1])
return 'ok'
`,
  },
  // KEYS: ch. ARGV: token (the closingAt the close attempt set)
  mppAbortClose: {
    keys: 1,
    lua: `
local c = redis.call('HMGET', KEYS[1], 'status', 'closingAt')
if c[1] == 'closing' and c[2] == ARGV[1] then redis.call('HSET', KEYS[1], 'status', 'open', 'closingAt', '0') end
return 1
`,
  },
  // KEYS: ch. ARGV: txHash, cumulative, captured
  mppFinishClose: {
    keys: 1,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'closed', 'closeTx', ARGV[1], 'closeCum', ARGV[2],
  'closeCaptured', ARGV[3], 'settled', ARGV[3])
return 1
`,
  },
  // KEYS: ch, vouchers. ARGV: settled
  mppRecordSettled: {
    keys: 2,
    lua: `
local c = redis.call('HMGET', KEYS[1], 'settled', 'highest')
if not c[1] then return 0 end
local settled = tonumber(c[1])
if tonumber(ARGV[1]) > settled then
  redis.call('HSET', KEYS[1], 'settled', ARGV[1])
  settled = tonumber(ARGV[1])
end
for _, k in ipairs(redis.call('HKEYS', KEYS[2])) do
  if tonumber(k) <= settled and k ~= c[2] then redis.call('HDEL', KEYS[2], k) end
end
return 1
`,
  },
  // KEYS: lock. ARGV: owner, ttlMs
  mppTryLock: {
    keys: 1,
    lua: `
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if owner then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`,
  },
  // KEYS: lock. ARGV: owner
  mppUnlock: {
    keys: 1,
    lua: `
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`,
  },
} as const;

type ScriptName = keyof typeof SCRIPTS;
type Arg = string | number;
type WithScripts = Redis & { [K in ScriptName]: (...args: Arg[]) => Promise<unknown> };

const STATUSES: ReadonlySet<string> = new Set<ChannelStatus>(["open", "closing", "closed"]);

function recordOf(channelId: Hex, h: Record<string, string>): ChannelRecord {
  const status = h["status"] ?? "";
  if (!STATUSES.has(status)) throw new Error("channel record is corrupt");
  const record: ChannelRecord = {
    channelId,
    descriptor: {
      payer: h["payer"] as Address,
      payee: h["payee"] as Address,
      operator: h["operator"] as Address,
      token: h["token"] as Address,
      salt: h["salt"] as Hex,
      authorizedSigner: h["signer"] as Address,
      expiringNonceHash: h["enh"] as Hex,
    },
    deposit: BigInt(h["deposit"] ?? "0"),
    settled: BigInt(h["settled"] ?? "0"),
    highest: { cumulative: BigInt(h["highest"] ?? "0"), signature: (h["sig"] ?? "0x") as Hex },
    spent: BigInt(h["spent"] ?? "0"),
    held: BigInt(h["held"] ?? "0"),
    units: Number(h["units"] ?? "0"),
    status: status as ChannelStatus,
  };
  if (h["closeTx"]) {
    record.closed = {
      txHash: h["closeTx"] as Hex,
      cumulative: BigInt(h["closeCum"] ?? "0"),
      captured: BigInt(h["closeCaptured"] ?? "0"),
    };
  }
  return record;
}

/** How often, and how long, a hold whose Reserve reply was lost is released again. */
const UNSURE_RELEASE = { delayMs: 250, maxDelayMs: 1_000, forMs: 60_000 };

/** The channel store over Redis: keys `<prefix>mpp:…`, one Lua script per check-and-update. */
export function createRedisChannelStore(redis: Redis, opts: RedisChannelStoreOptions = {}): ChannelStore {
  const p = `${opts.prefix ?? "tollgate:"}mpp:`;
  const retentionMs = opts.reservationRetentionMs ?? 24 * 3_600_000;
  const client = redis as WithScripts;
  for (const [name, script] of Object.entries(SCRIPTS) as [ScriptName, { keys: number; lua: string }][]) {
    if (typeof client[name] !== "function") {
      client.defineCommand(name, { numberOfKeys: script.keys, lua: script.lua });
    }
  }

  const ch = (id: Hex) => `${p}ch:{${id}}`;
  const holds = (id: Hex) => `${ch(id)}:holds`;
  const exps = (id: Hex) => `${ch(id)}:exp`;
  const vouchers = (id: Hex) => `${ch(id)}:vouchers`;
  const res = (id: Hex, rid: string) => `${p}res:{${id}}:${rid}`;
  /** The used mark of a challenge; without one, a key of the channel's slot the script leaves alone. */
  const used = (id: Hex, challenge: ChallengeUse | undefined) => `${p}used:{${id}}:${challenge?.id ?? ""}`;
  const usedUntil = (challenge: ChallengeUse | undefined) => (challenge ? String(challenge.until) : "");
  const dirtyKey = `${p}dirty`;
  const lock = (name: string) => `${p}lock:${name}`;

  /** The keys `reserve` (Lua) touches. */
  const holdKeys = (channelId: Hex, reservationId: string) =>
    [ch(channelId), holds(channelId), exps(channelId), res(channelId, reservationId)] as const;
  /** The arguments `reserve` (Lua) reads. */
  const holdArgv = (reservationId: string, amount: bigint, now: number, expiresAt: number) =>
    [reservationId, amount.toString(), now, expiresAt, expiresAt + retentionMs] as const;

  /**
   * Runs a script that may take hold `reservationId`. When the connection dropped while it ran,
   * Redis may hold the amount without us knowing (the reply was lost): the caller gets the
   * error (503, no model runs), and the hold goes back once Redis answers again, not at its
   * expiry (a no-op if it never ran).
   */
  async function unsure<T>(channelId: Hex, reservationId: string, script: () => Promise<T>): Promise<T> {
    try {
      return await script();
    } catch (err) {
      if (isRedisUnavailable(err) && reservationId !== "")
        // Given up after a minute: the hold then lapses at its expiry, as before.
        void retrying(
          () => store.release(channelId, reservationId, Date.now()),
          isRedisUnavailable,
          UNSURE_RELEASE,
        ).catch(() => undefined);
      throw err;
    }
  }

  /** A reserve's answer: the figures of `reserved`, or why not. */
  const reserveOutcome = ([kind, spent, accepted, units]: string[]): ReserveOutcome =>
    kind === "reserved"
      ? { kind, spent: BigInt(spent!), accepted: BigInt(accepted!), units: Number(units) }
      : ({ kind } as ReserveOutcome);

  const store: ChannelStore = {
    async get(channelId) {
      const h = await redis.hgetall(ch(channelId));
      return Object.keys(h).length === 0 ? undefined : recordOf(channelId, h);
    },

    async create(c) {
      const d = c.descriptor;
      const created = await client.mppCreateChannel(
        ch(c.channelId),
        vouchers(c.channelId),
        d.payer,
        d.payee,
        d.operator,
        d.token,
        d.salt,
        d.authorizedSigner,
        d.expiringNonceHash,
        c.deposit.toString(),
        c.settled.toString(),
        c.voucher.cumulative.toString(),
        c.voucher.signature,
      );
      return created === 1;
    },

    async offerVoucher(channelId, voucher, hold) {
      const rid = hold?.reservationId ?? "";
      const [kind, accepted, spent, units, held] = (await unsure(channelId, rid, () =>
        client.mppOfferVoucher(
          ...holdKeys(channelId, rid),
          vouchers(channelId),
          used(channelId, hold?.challenge),
          ...holdArgv(rid, hold?.amount ?? 0n, hold?.now ?? 0, hold?.expiresAt ?? 0),
          voucher.cumulative.toString(),
          voucher.signature,
          voucher.checked ? "1" : "0",
          voucher.chainDeposit.toString(),
          voucher.chainSettled.toString(),
          usedUntil(hold?.challenge),
        ),
      )) as string[];
      if (kind !== "accepted" && kind !== "same") return { kind } as OfferVoucherOutcome;
      const figures = { accepted: BigInt(accepted!), spent: BigInt(spent!), units: Number(units) };
      if (!hold) return { kind, ...figures };
      return {
        kind,
        ...figures,
        held: held === "reserved" ? { kind: "reserved", ...figures } : ({ kind: held } as ReserveOutcome),
      };
    },

    async raiseDeposit(channelId, deposit) {
      await client.mppRaiseDeposit(ch(channelId), deposit.toString());
    },

    async reserve(channelId, reservationId, amount, now, expiresAt, challenge) {
      const answer = await unsure(channelId, reservationId, () =>
        client.mppReserve(
          ...holdKeys(channelId, reservationId),
          used(channelId, challenge),
          ...holdArgv(reservationId, amount, now, expiresAt),
          usedUntil(challenge),
        ),
      );
      return reserveOutcome(answer as string[]);
    },

    async commit(channelId, reservationId, actual, now): Promise<CommitOutcome> {
      const [kind, spent, accepted, units, at, charged] = (await client.mppCommit(
        ch(channelId),
        holds(channelId),
        exps(channelId),
        res(channelId, reservationId),
        reservationId,
        actual.toString(),
        now,
        now + retentionMs,
      )) as string[];
      if (kind === "committed") {
        return {
          kind,
          spent: BigInt(spent!),
          accepted: BigInt(accepted!),
          units: Number(units),
          committedAt: Number(at),
          // A record committed before 'charged' was kept: its charge was within the hold.
          charged: charged === undefined ? actual : BigInt(charged),
        };
      }
      if (kind === "released" || kind === "expired") return { kind };
      return { kind: "unknown" };
    },

    async release(channelId, reservationId, now) {
      return (await client.mppRelease(
        ch(channelId),
        holds(channelId),
        exps(channelId),
        res(channelId, reservationId),
        reservationId,
        now + retentionMs,
      )) as ReleaseOutcome;
    },

    async beginClose(channelId, now, staleAfterMs) {
      const kind = (await client.mppBeginClose(
        ch(channelId),
        holds(channelId),
        exps(channelId),
        now,
        staleAfterMs,
      )) as "ok" | "unknown" | "closed" | "closing" | "busy";
      if (kind !== "ok") return { kind };
      const h = await redis.hgetall(ch(channelId));
      return { kind, token: now, record: recordOf(channelId, h) };
    },

    async abortClose(channelId, token) {
      await client.mppAbortClose(ch(channelId), String(token));
    },

    async finishClose(channelId, close) {
      await client.mppFinishClose(
        ch(channelId),
        close.txHash,
        close.cumulative.toString(),
        close.captured.toString(),
      );
    },

    async recordSettled(channelId, settled) {
      await client.mppRecordSettled(ch(channelId), vouchers(channelId), settled.toString());
    },

    async vouchers(channelId) {
      const h = await redis.hgetall(vouchers(channelId));
      return Object.entries(h).map(([cumulative, signature]) => ({
        cumulative: BigInt(cumulative),
        signature: signature as Hex,
      }));
    },

    async markDirty(channelId) {
      await redis.sadd(dirtyKey, channelId);
    },

    async clearDirty(channelId) {
      await redis.srem(dirtyKey, channelId);
    },

    async dirty() {
      return (await redis.smembers(dirtyKey)) as Hex[];
    },

    async tryLock(name, owner, ttlMs) {
      return (await client.mppTryLock(lock(name), owner, Math.max(1, Math.ceil(ttlMs)))) === 1;
    },

    async unlock(name, owner) {
      await client.mppUnlock(lock(name), owner);
    },
  };
  return store;
}
