import { isRedisUnavailable, type Pipeline, pipelined, type Redis } from "@tollgate/kit/redis";
import { retrying } from "@tollgate/kit/retry";
import {
  type BudgetCount,
  DEFAULT_RESERVATION_TTL_SECONDS,
  DEFAULT_SETTLEMENT_WINDOW_SECONDS,
  isReservationId,
  leaseTicketOf,
  type SettleItem,
  type Settlement,
  type SettleOutcome,
} from "../domain/budget.js";
import type { Ledger, LedgerOptions, WindowCount } from "../domain/ports.js";
import { BUCKET_MS, WINDOW_BUCKETS } from "../domain/rate-limit.js";

/** Options of the Redis ledger. */
export interface RedisLedgerOptions extends LedgerOptions {
  /** Prefix of every key this ledger touches. Default "tollgate:". */
  prefix?: string;
  /**
   * "redis" (default) reads the clock of the Redis server for rate-limit buckets and hold
   * expiry, so every replica counts on one clock; "caller" uses the `now` passed in (tests
   * that move time). The budget period is always the caller's (it names the keys).
   */
  clock?: "redis" | "caller";
}

// Layout, under <prefix>auth: (every key of one account carries its hash tag {accountId})
//   rl2:{a}:<scope>:<unit>                     HASH bucket second → units (rate-limit window),
//                                              plus t (their total), o (oldest), n (newest)
//   budget:{a}:<connection|key>:<id>:<period>  HASH spent, held, r:<reservation id> → amount held
//                                              (":1" appended in the reservation's first budget)
//   budget:{a}:<…>:<period>:holds              ZSET reservation id by hold expiry (ms)
//   reservation:rsv_<20>_{a}                   HASH amount, expiresAt, keepUntil, budgets, state,
//                                              cost, eventId, settledAt; a lease (state lease,
//                                              then returned) also windows, bucket, charged,
//                                              t:<ticket> → cost per request charged, and once
//                                              returned u:<ticket> → quote per unsure request and
//                                              left (what may still be charged on it)
// Amounts are decimal strings changed only with HINCRBY (exact int64). Lua compares them as
// doubles, exact because budgets are at most 2^53 - 1: a sum above that compares as above any
// budget. Budget keys live until their period ends plus the settlement window; reservation
// records for the settlement window.

// The script's clock: ARGV[1] in ms when the caller injects one (tests), else Redis TIME, so
// replicas with skewed clocks agree.
const NOW_LUA = `
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
`;

// The sliding window of domain/rate-limit.ts (countWindow) and the budget rule of
// domain/budget.ts (fits) for one request, in one atomic step: check every window and every
// budget (after dropping expired holds), and only if all have room, count the request in each
// window and hold its quote against each budget, recording the reservation.
// A window's hash keeps, next to its per-second buckets, their total ('t'), the oldest bucket
// ('o') and the newest ('n'): while no bucket has left the window the count is those three
// fields (one HMGET), not the 61 buckets. The buckets are read only when one has left the window
// (then dropped and the totals recounted: about once a second per busy window) and to work out
// the retry time of a refusal.
//   KEYS: n windows, then per budget its hash and its holds zset, then (mode 'hold') the record
//   ARGV: now ms ('' = Redis TIME), bucket ms, buckets per window, n, m, mode ('', 'peek',
//         'hold', 'lease': a hold whose record also names its windows and bucket), reservation id, amount, hold ms, record ms, then limit and cost per window,
//         then limit, keep ms and id per budget
//   Returns: rate ok (0/1), budgets ok (0/1), now ms, expired reservations (counted in their
//            first budget only), then per window: used, newest bucket (-1 none), retry ms (0
//            fits, -1 never); then per budget: spent, held (strings)
const ADMIT_LUA = `
${NOW_LUA}local width = tonumber(ARGV[2])
local span = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local m = tonumber(ARGV[5])
local mode = ARGV[6]
local rid = ARGV[7]
local amount = ARGV[8]
local W = 10
local B = W + 2 * n
local current = math.floor(now / width)
local oldest = current - span + 1
local rateOk = 1
local out = {}
local firsts, newests = {}, {}
local function buckets(key)
  local flat = redis.call('HGETALL', key)
  local live, stale = {}, {}
  for j = 1, #flat, 2 do
    local b = tonumber(flat[j])
    if b then
      if b < oldest then
        stale[#stale + 1] = flat[j]
      else
        live[#live + 1] = { b, tonumber(flat[j + 1]) }
      end
    end
  end
  return live, stale
end
for i = 1, n do
  local key = KEYS[i]
  local limit = tonumber(ARGV[W + 2 * i - 1])
  local cost = tonumber(ARGV[W + 2 * i])
  local meta = redis.call('HMGET', key, 't', 'o', 'n')
  local used, first, newest = 0, nil, -1
  if meta[2] then
    used, first, newest = tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3])
  end
  local live = nil
  if first and first < oldest then
    local stale
    live, stale = buckets(key)
    if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
    used, first, newest = 0, nil, -1
    for _, e in ipairs(live) do
      used = used + e[2]
      if first == nil or e[1] < first then first = e[1] end
      if e[1] > newest then newest = e[1] end
    end
    if first then
      redis.call('HSET', key, 't', used, 'o', first, 'n', newest)
    else
      redis.call('HDEL', key, 't', 'o', 'n')
    end
  end
  firsts[i], newests[i] = first, newest
  local retry = 0
  if used + cost > limit then
    rateOk = 0
    retry = -1
    if cost <= limit then
      if live == nil then live = buckets(key) end
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
local budgetOk = 1
local expired = 0
for j = 1, m do
  local h, z = KEYS[n + 2 * j - 1], KEYS[n + 2 * j]
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  if #gone > 0 then
    for _, r in ipairs(gone) do
      local a = redis.call('HGET', h, 'r:' .. r)
      if a then
        local c = string.find(a, ':', 1, true)
        if c then
          a = string.sub(a, 1, c - 1)
          expired = expired + 1
        end
        redis.call('HINCRBY', h, 'held', '-' .. a)
        redis.call('HDEL', h, 'r:' .. r)
      end
    end
    redis.call('ZREMRANGEBYSCORE', z, '-inf', now)
  end
  local sh = redis.call('HMGET', h, 'spent', 'held')
  local spent = sh[1] or '0'
  local held = sh[2] or '0'
  if (mode == 'hold' or mode == 'lease') and tonumber(spent) + tonumber(held) + tonumber(amount) > tonumber(ARGV[B + 3 * j - 2]) then
    budgetOk = 0
  end
  out[#out + 1] = spent
  out[#out + 1] = held
end
if rateOk == 1 and budgetOk == 1 then
  for i = 1, n do
    local cost = tonumber(ARGV[W + 2 * i])
    if cost > 0 then
      local key = KEYS[i]
      redis.call('HINCRBY', key, current, cost)
      redis.call('HINCRBY', key, 't', cost)
      if firsts[i] == nil or current < firsts[i] then redis.call('HSET', key, 'o', current) end
      if current > newests[i] then redis.call('HSET', key, 'n', current) end
      redis.call('PEXPIRE', key, (span + 1) * width)
    end
  end
  if mode == 'hold' or mode == 'lease' then
    local expires = now + tonumber(ARGV[9])
    local ids = {}
    for j = 1, m do
      local h, z = KEYS[n + 2 * j - 1], KEYS[n + 2 * j]
      local keep = tonumber(ARGV[B + 3 * j - 1])
      redis.call('HINCRBY', h, 'held', amount)
      redis.call('HSET', h, 'r:' .. rid, j == 1 and (amount .. ':1') or amount)
      redis.call('ZADD', z, expires, rid)
      redis.call('PEXPIRE', h, keep)
      redis.call('PEXPIRE', z, keep)
      ids[#ids + 1] = ARGV[B + 3 * j]
    end
    local rec = KEYS[n + 2 * m + 1]
    redis.call('HSET', rec, 'amount', amount, 'expiresAt', expires, 'keepUntil', now + tonumber(ARGV[10]),
      'budgets', table.concat(ids, ' '), 'state', 'held')
    if mode == 'lease' then
      local wins = {}
      for i = 1, n do wins[i] = KEYS[i] end
      redis.call('HSET', rec, 'state', 'lease', 'windows', table.concat(wins, ' '), 'bucket', current,
        'charged', 0)
    end
    redis.call('PEXPIRE', rec, tonumber(ARGV[10]))
  end
end
table.insert(out, 1, expired)
table.insert(out, 1, now)
table.insert(out, 1, budgetOk)
table.insert(out, 1, rateOk)
return out
`;

// What a lease still holds in one budget (hash h, holds zset z), set to left(a) of its amount a
// (never below 0 nor above a; dropped at 0, the first budget's mark kept); returns what it freed
// and whether this dropped the hold.
const LEASE_HOLD_LUA = `
local function leaseHold(h, z, rid, left)
  local a = redis.call('HGET', h, 'r:' .. rid)
  if not a then return 0, false end
  local c = string.find(a, ':', 1, true)
  local mark = ''
  if c then a, mark = string.sub(a, 1, c - 1), string.sub(a, c) end
  a = tonumber(a)
  local l = left(a)
  if l < 0 then l = 0 end
  if l > a then l = a end
  redis.call('HINCRBY', h, 'held', string.format('%.0f', l - a))
  if l == 0 then
    redis.call('HDEL', h, 'r:' .. rid)
    redis.call('ZREM', z, rid)
  else
    redis.call('HSET', h, 'r:' .. rid, string.format('%.0f', l) .. mark)
  end
  return a - l, l == 0
end
`;

// Settles a reservation once: removes its holds (if not yet dropped as expired), adds the cost
// to the spend of each budget period it was made in, and marks the record settled. The cost is
// never more than the reservation's amount (its hold, the request's quote): above it, the amount
// is charged (docs/money.md, "Charges").
// A lease's record is charged instead, once per ticket (the request's `<lease id>~<n>`): the cost
// comes out of the lease's hold (as far as it goes; after the return, an unsure request's whole
// quote does) and into spend. Never more than is left of the lease (docs/money.md, "Leases"):
// its amount less what was charged on it, or once returned what the return left to charge
// ('left', which each charge lowers by what it takes out); an unsure ticket never more than its
// quote. So whatever a usage event names, a lease's tickets together charge at most its hold.
// A lease that holds no budget (rate-limit units only) has no hold to be over: its ticket is
// recorded as settled at the cost asked, and no spend or 'charged' moves.
// Costs above 2^53 compare as above any amount (amounts are at most 2^53 - 1); the cost charged
// is then an amount, exact.
// One call settles any number of items of one reservation, in order, each exactly as a call of
// its own would (a batch's tickets of one lease: one call, not one each).
//   KEYS: the record, then per budget its hash and its holds zset
//   ARGV: now ms ('' = Redis TIME), reservation id, budget ids as read before, then per item:
//         cost, event id, ticket ('' when the id names no lease ticket)
//   Returns: per item, its outcome, cost charged and, when the record is a lease, 'lease' and
//         '1' if this charge ended its hold in its first budget ('0' if not); or 'error' and why
//         (the record's budgets are not the ones given)
const SETTLE_LUA = `
${LEASE_HOLD_LUA}${NOW_LUA}local rid, budgets = ARGV[2], ARGV[3]
local function settleOne(cost, eventId, ticket)
  local st = redis.call('HMGET', KEYS[1], 'state', 'budgets', 'expiresAt', 'cost', 'keepUntil',
    'amount', 'charged', 'left')
  if not st[1] then return { 'unknown', '' } end
  if tonumber(st[5]) <= now then return { 'unknown', '' } end
  if st[1] == 'settled' then return { 'already_settled', st[4] } end
  if st[2] ~= budgets then return { 'error', 'reservation budgets changed' } end
  local keep = redis.call('PTTL', KEYS[1])
  if st[1] == 'lease' or st[1] == 'returned' then
    local eid = 'e:' .. eventId
    if ticket ~= '' then eid = 't:' .. ticket end
    local prior = redis.call('HGET', KEYS[1], eid)
    if prior then return { 'already_settled', prior } end
    if #KEYS == 1 then
      redis.call('HSET', KEYS[1], eid, cost)
      if tonumber(st[3]) <= now then return { 'settled_after_expiry', cost, 'lease' } end
      return { 'settled', cost, 'lease' }
    end
    local left = tonumber(st[6] or '0') - tonumber(st[7] or '0')
    if st[8] then left = tonumber(st[8]) end
    if left < 0 then left = 0 end
    local room = left
    local unsure = nil
    if ticket ~= '' then
      unsure = redis.call('HGET', KEYS[1], 'u:' .. ticket)
      if unsure then
        unsure = tonumber(unsure)
        if unsure < room then room = unsure end
      end
    end
    if tonumber(cost) > room then cost = string.format('%.0f', room) end
    local out = unsure or tonumber(cost)
    left = left - out
    if left < 0 then left = 0 end
    local ended = '0'
    for j = 1, (#KEYS - 1) / 2 do
      local h, z = KEYS[2 * j], KEYS[2 * j + 1]
      local _, dropped = leaseHold(h, z, rid, function(a)
        local l = a - out
        if l > left then l = left end
        return l
      end)
      if j == 1 and dropped then ended = '1' end
      redis.call('HINCRBY', h, 'spent', cost)
      if redis.call('PTTL', h) < 0 and keep > 0 then redis.call('PEXPIRE', h, keep) end
    end
    redis.call('HSET', KEYS[1], eid, cost)
    redis.call('HINCRBY', KEYS[1], 'charged', cost)
    if st[8] then redis.call('HSET', KEYS[1], 'left', string.format('%.0f', left)) end
    if tonumber(st[3]) <= now then return { 'settled_after_expiry', cost, 'lease', ended } end
    return { 'settled', cost, 'lease', ended }
  end
  if st[6] and tonumber(cost) > tonumber(st[6]) then cost = st[6] end
  for j = 1, (#KEYS - 1) / 2 do
    local h, z = KEYS[2 * j], KEYS[2 * j + 1]
    local a = redis.call('HGET', h, 'r:' .. rid)
    if a then
      local c = string.find(a, ':', 1, true)
      if c then a = string.sub(a, 1, c - 1) end
      redis.call('HINCRBY', h, 'held', '-' .. a)
      redis.call('HDEL', h, 'r:' .. rid)
      redis.call('ZREM', z, rid)
    end
    redis.call('HINCRBY', h, 'spent', cost)
    if redis.call('PTTL', h) < 0 and keep > 0 then redis.call('PEXPIRE', h, keep) end
  end
  redis.call('HSET', KEYS[1], 'state', 'settled', 'cost', cost, 'eventId', eventId, 'settledAt', now)
  if tonumber(st[3]) <= now then return { 'settled_after_expiry', cost } end
  return { 'settled', cost }
end
local replies = {}
for i = 4, #ARGV, 3 do
  replies[#replies + 1] = settleOne(ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
return replies
`;

// Ends a lease: keeps of its hold in each budget only what was committed on it and not yet
// charged, releases the rest, gives its unused units back to the bucket it took them from (if
// that bucket is still counted), records what may still be charged on it ('left': the same
// committed and not yet charged, within its amount) and marks it returned. A repeat changes
// nothing.
//   KEYS: the record, then per budget its hash and its holds zset, then its windows
//   ARGV: reservation id, committed, unused requests, unused tokens, budget ids as read before,
//         number of budgets, unsure tickets ('<ticket>:<quote>' separated by spaces): an unsure
//         ticket charged already counts its quote, one not yet charged is remembered
//   Returns: outcome ('returned', 'not_lease'), base units released from the first budget, and
//            '1' if the return ended the lease's hold there ('0' if not)
const RETURN_LUA = `
${LEASE_HOLD_LUA}local st = redis.call('HMGET', KEYS[1], 'state', 'budgets', 'charged', 'bucket')
if st[1] ~= 'lease' then return { 'not_lease', '0', '0' } end
if st[2] ~= ARGV[5] then return redis.error_reply('reservation budgets changed') end
local rid = ARGV[1]
local charged = tonumber(st[3] or '0')
for pair in string.gmatch(ARGV[7], '%S+') do
  local c = string.find(pair, ':', 1, true)
  local ticket, quote = string.sub(pair, 1, c - 1), string.sub(pair, c + 1)
  local paid = redis.call('HGET', KEYS[1], 't:' .. ticket)
  if paid then
    charged = charged - tonumber(paid) + tonumber(quote)
  else
    redis.call('HSET', KEYS[1], 'u:' .. ticket, quote)
  end
end
local keep = tonumber(ARGV[2]) - charged
if keep < 0 then keep = 0 end
-- What may still be charged on it: what stays committed, within what is left of its amount.
local left = tonumber(redis.call('HGET', KEYS[1], 'amount') or '0') - tonumber(st[3] or '0')
if left < 0 then left = 0 end
if keep < left then left = keep end
redis.call('HSET', KEYS[1], 'left', string.format('%.0f', left))
local m = tonumber(ARGV[6])
local released, ended = 0, '0'
for j = 1, m do
  local freed, dropped = leaseHold(KEYS[2 * j], KEYS[2 * j + 1], rid, function() return keep end)
  if j == 1 then
    released = freed
    if dropped then ended = '1' end
  end
end
for i = 2 * m + 2, #KEYS do
  local key = KEYS[i]
  local back = tonumber(ARGV[3])
  if string.sub(key, -7) == ':tokens' then back = tonumber(ARGV[4]) end
  local units = tonumber(redis.call('HGET', key, st[4]) or '0')
  if back > units then back = units end
  if back > 0 then
    redis.call('HINCRBY', key, st[4], -back)
    redis.call('HINCRBY', key, 't', -back)
  end
end
redis.call('HSET', KEYS[1], 'state', 'returned')
return { 'returned', string.format('%.0f', released), ended }
`;

/**
 * Reservations a replica remembers until settled, the oldest forgotten first: some 40 s of
 * admissions at 250 a second, while a settlement comes within seconds (about 1 MB).
 */
const MAX_HELD_HERE = 10_000;

/** How often, and how long, a hold whose admission reply was lost is released again. */
const UNSURE_RELEASE = { delayMs: 250, maxDelayMs: 1_000, forMs: 60_000 };

type WithScripts = Redis & {
  authAdmit(numKeys: number, ...args: Array<string | number>): Promise<Array<number | string>>;
  authSettle(...args: [number, ...Array<string | number>]): Promise<SettleReply[]>;
  authReturnLease(numKeys: number, ...args: Array<string | number>): Promise<[string, string, string]>;
};

/**
 * One item's reply of the settlement script: outcome, cost charged, and for a lease 'lease' and
 * whether this charge ended its hold ('1'); or 'error' and why.
 */
type SettleReply = [string, string, string?, string?];

/** One item the settlement script settles: its cost, event id and lease ticket ('' for none). */
type ScriptItem = { cost: bigint; eventId: string; ticket: string };

/** The settlement script's arguments for items of one reservation whose record names `budgets`. */
type SettleArgs = (
  reservationId: string,
  budgets: string,
  items: readonly ScriptItem[],
  now: Date,
) => [number, ...Array<string | number>];

const OUTCOMES: readonly SettleOutcome[] = ["settled", "settled_after_expiry", "already_settled", "unknown"];

/**
 * Rate-limit counters, budget holds and spend in Redis, correct across replicas: one Lua script
 * per Authorize decides rate limits and budgets together, one per settlement.
 */
export function createRedisLedger(redis: Redis, opts: RedisLedgerOptions = {}): Ledger {
  const p = `${opts.prefix ?? "tollgate:"}auth:`;
  const holdMs = opts.holdMs ?? DEFAULT_RESERVATION_TTL_SECONDS * 1_000;
  const windowMs = opts.settlementWindowMs ?? DEFAULT_SETTLEMENT_WINDOW_SECONDS * 1_000;
  const client = redis as WithScripts;
  if (typeof client.authAdmit !== "function") {
    // No fixed key count: the first argument of each call says how many keys follow.
    client.defineCommand("authAdmit", { lua: ADMIT_LUA });
    client.defineCommand("authSettle", { lua: SETTLE_LUA });
    client.defineCommand("authReturnLease", { lua: RETURN_LUA });
  }
  // The budgets of the reservations this replica took, until they are settled: a settlement
  // that finds its reservation here runs the settle script at once (one round trip), instead of
  // reading the record's budgets first. The script still checks them against the record.
  const heldHere = new Map<string, string>();
  const budgetKey = (id: string) => `${p}budget:${id}`;
  const holdsKey = (id: string) => `${p}budget:${id}:holds`;
  const recordKey = (reservationId: string) => `${p}reservation:${reservationId}`;
  const clockArg = (now: Date) => (opts.clock === "caller" ? now.getTime() : "");

  /**
   * Runs the admission script. When the connection drops while it runs, Redis may have taken the
   * hold without us hearing so (the reply was lost): the caller gets the error (503), and the
   * reservation is released in the background once Redis answers again (a zero-cost settlement;
   * a no-op when the script never ran), so no orphan hold waits for its TTL.
   */
  async function admitOrReleaseLater<T>(
    reservationId: string | undefined,
    run: () => Promise<T>,
  ): Promise<T> {
    try {
      return await run();
    } catch (err) {
      if (reservationId && isRedisUnavailable(err)) void releaseWhenBack(reservationId);
      throw err;
    }
  }

  function releaseWhenBack(reservationId: string): Promise<unknown> {
    const release = () => ledger.settle(reservationId, 0n, `unsure_${reservationId}`, new Date());
    // Given up after a minute: the hold then lapses with its TTL, as before.
    return retrying(release, isRedisUnavailable, UNSURE_RELEASE).catch(() => undefined);
  }

  const ledger: Ledger = {
    async admit(windows, ask, now) {
      const checks = ask ? ("hold" in ask ? ask.hold.budgets : ask.peek) : [];
      const hold = ask && "hold" in ask ? ask.hold : undefined;
      if (windows.length === 0 && checks.length === 0) {
        const nowMs = now.getTime();
        return {
          admitted: true,
          rateAdmitted: true,
          budgetsAdmitted: true,
          nowMs,
          counts: [],
          budgets: [],
        };
      }
      const keys = [
        // "rl2:", not "rl:": a window that keeps its totals; the earlier layout (buckets only)
        // stays apart, so replicas of both versions can run side by side during an upgrade.
        ...windows.map((w) => `${p}rl2:${w.id}`),
        ...checks.flatMap((c) => [budgetKey(c.id), holdsKey(c.id)]),
        ...(hold ? [recordKey(hold.reservationId)] : []),
      ];
      const reply = await admitOrReleaseLater(hold?.reservationId, () =>
        client.authAdmit(
          keys.length,
          ...keys,
          clockArg(now),
          BUCKET_MS,
          WINDOW_BUCKETS,
          windows.length,
          checks.length,
          hold ? (hold.lease ? "lease" : "hold") : checks.length > 0 ? "peek" : "",
          hold?.reservationId ?? "",
          hold ? hold.amount.toString() : "0",
          holdMs,
          windowMs,
          ...windows.flatMap((w) => [w.limit, w.cost]),
          ...checks.flatMap((c) => [
            c.limit.toString(),
            // Kept until the period ends plus the settlement window (relative: the caller's clock).
            Math.max(1, c.periodEndMs - now.getTime() + windowMs),
            c.id,
          ]),
        ),
      );
      const rateAdmitted = reply[0] === 1;
      const budgetsAdmitted = reply[1] === 1;
      if (hold && rateAdmitted && budgetsAdmitted) {
        if (heldHere.size >= MAX_HELD_HERE) heldHere.delete(heldHere.keys().next().value as string);
        heldHere.set(hold.reservationId, checks.map((c) => c.id).join(" "));
      }
      const expired = Number(reply[3]);
      if (expired > 0) opts.onHoldsExpired?.(expired);
      const counts: WindowCount[] = windows.map((_, i) => ({
        used: Number(reply[4 + 3 * i]),
        newestBucket: Number(reply[5 + 3 * i]),
        retryAfterMs: Number(reply[6 + 3 * i]),
      }));
      const at = 4 + 3 * windows.length;
      const budgets: BudgetCount[] = checks.map((_, j) => ({
        spent: BigInt(reply[at + 2 * j] ?? 0),
        held: BigInt(reply[at + 2 * j + 1] ?? 0),
      }));
      return {
        admitted: rateAdmitted && budgetsAdmitted,
        rateAdmitted,
        budgetsAdmitted,
        nowMs: Number(reply[2]),
        counts,
        budgets,
      };
    },

    async consume(windows, now) {
      return ledger.admit(windows, undefined, now);
    },

    async returnLease(leaseId, back, _now) {
      if (!isReservationId(leaseId)) return { released: 0n };
      const record = recordKey(leaseId);
      const [budgets, windows] = await redis.hmget(record, "budgets", "windows");
      if (budgets === null || budgets === undefined) return { released: 0n };
      const ids = budgets === "" ? [] : budgets.split(" ");
      const keys = [
        record,
        ...ids.flatMap((id) => [budgetKey(id), holdsKey(id)]),
        ...(windows ? windows.split(" ") : []),
      ];
      const [, released, ended] = await client.authReturnLease(
        keys.length,
        ...keys,
        leaseId,
        back.committed.toString(),
        back.unusedRequests,
        back.unusedTokens,
        budgets,
        ids.length,
        back.unsure.map((u) => `${u.ticket}:${u.quote}`).join(" "),
      );
      if (ended === "1") opts.onHoldSettled?.();
      return { released: BigInt(released) };
    },

    async settle(id, cost, eventId, now) {
      const { reservationId, ticket } = reservationOf(id);
      if (!isReservationId(reservationId)) return { outcome: "unknown" };
      const here = heldHere.get(reservationId);
      heldHere.delete(reservationId);
      if (here !== undefined) {
        try {
          return await settleWith(id, reservationId, here, cost, eventId, now, ticket);
        } catch (err) {
          if (isRedisUnavailable(err)) throw err;
          // The record says otherwise (it cannot, as ids are never reused): read it below.
        }
      }
      // The budgets a reservation holds never change once it exists: read them, then let the
      // script check that they are still what it was given (and that nobody settled first).
      const budgets = await redis.hget(recordKey(reservationId), "budgets");
      if (budgets === null) return { outcome: "unknown" };
      return settleWith(id, reservationId, budgets, cost, eventId, now, ticket);
    },
  };

  async function settleWith(
    settledId: string,
    reservationId: string,
    budgets: string,
    cost: bigint,
    eventId: string,
    now: Date,
    ticket: string,
  ): Promise<Settlement> {
    const [reply] = await client.authSettle(
      ...settleArgs(reservationId, budgets, [{ cost, eventId, ticket }], now),
    );
    const result = settled({ reservationId: settledId, cost, eventId }, reply);
    if (result instanceof Error) throw result;
    return result;
  }

  /**
   * The settlement script's arguments (SETTLE_LUA: KEYS then ARGV) for items of one reservation
   * whose record names `budgets`: the one place its calling convention is written.
   */
  const settleArgs: SettleArgs = (reservationId, budgets, items, now) => {
    const ids = budgets === "" ? [] : budgets.split(" ");
    const keys = [recordKey(reservationId), ...ids.flatMap((id) => [budgetKey(id), holdsKey(id)])];
    return [
      keys.length,
      ...keys,
      clockArg(now),
      reservationId,
      budgets,
      ...items.flatMap((i) => [i.cost.toString(), i.eventId, i.ticket]),
    ];
  };

  /** One item's reply of the settlement script as a Settlement, or the Error it names. */
  function settled(item: SettleItem, reply: SettleReply | undefined): Settlement | Error {
    if (reply === undefined) return new Error("no settlement reply");
    return reply[0] === "error" ? new Error(reply[1]) : capped(item, reply);
  }

  /** The script's reply as a Settlement; a cost charged below the one asked is told to onOverHold. */
  function capped(item: SettleItem, [outcome, charged, kind, ended]: SettleReply): Settlement {
    const s = settlementOf(outcome, charged);
    if ((s.outcome !== "settled" && s.outcome !== "settled_after_expiry") || s.cost === undefined) return s;
    // A reservation's hold ends with its settlement; a lease's with the charge that empties it.
    if (kind !== "lease" || ended === "1") opts.onHoldSettled?.();
    if (s.cost >= item.cost) return s;
    opts.onOverHold?.({
      kind: kind === "lease" ? "lease" : "reservation",
      reservationId: item.reservationId,
      eventId: item.eventId,
      asked: item.cost,
      charged: s.cost,
    });
    return { ...s, uncharged: item.cost - s.cost };
  }
  ledger.settleMany = settleManyIn(redis, recordKey, settleArgs, settled);
  return ledger;
}

/** The reservation an id settles, and its lease ticket ("" when it names none). */
function reservationOf(id: string): { reservationId: string; ticket: string } {
  const t = leaseTicketOf(id);
  return t ? { reservationId: t.leaseId, ticket: String(t.ticket) } : { reservationId: id, ticket: "" };
}

/** The settlement script's reply: its outcome and, once settled, the cost it settled at. */
function settlementOf(outcome: string, settled: string): Settlement {
  const known = OUTCOMES.find((o) => o === outcome) ?? "unknown";
  return known === "unknown" || settled === ""
    ? { outcome: known }
    : { outcome: known, cost: BigInt(settled) };
}

// Batch settlement (SettleReservations): settle()'s two steps for every item at once, so a
// batch costs two Redis round trips however many reservations it holds: one pipeline reads
// each distinct record's budgets once (a lease's tickets share one record), one pipeline runs
// the settlement script once per known record, for all of its items (a lease's tickets in one
// call: docs/performance.md, "One script per lease in a settlement batch"). Each script is
// settle()'s own and touches one reservation's keys, which share its account's hash tag (on a
// Redis Cluster, one pipeline per account, sent together). An item whose read or script failed
// is answered by its error and the others stand.

/**
 * Most items one settlement script call settles: a batch's tickets of one lease go in calls of
 * this many, which amortises a call's cost over them while keeping each call short (every item
 * runs some ten Redis commands inside the script, and Redis serves nobody else meanwhile).
 */
const SETTLE_ITEMS_PER_CALL = 64;

type SettlePipeline = Pipeline & {
  authSettle(...args: [number, ...Array<string | number>]): SettlePipeline;
};

function settleManyIn(
  redis: Redis,
  recordKey: (reservationId: string) => string,
  settleArgs: SettleArgs,
  settled: (item: SettleItem, reply: SettleReply | undefined) => Settlement | Error,
): NonNullable<Ledger["settleMany"]> {
  return async (items, now) => {
    // Each item's reservation (a lease ticket names its lease) and record, worked out once.
    const parsed = items.map((item) => {
      const { reservationId, ticket } = reservationOf(item.reservationId);
      return { item, reservationId, ticket, record: recordKey(reservationId) };
    });
    const out: Array<Settlement | Error | undefined> = parsed.map((p) =>
      isReservationId(p.reservationId) ? undefined : { outcome: "unknown" },
    );
    const reading = parsed.flatMap((p, k) => (out[k] === undefined ? [{ k, ...p }] : []));
    if (reading.length === 0) return out as Settlement[];
    // One read per record: a lease's tickets (a batch holds many) share their lease's record.
    const records = [...new Set(reading.map((r) => r.record))];
    const budgetsRead = await pipelined(
      redis,
      records,
      (record) => record,
      (p, record) => p.hget(record, "budgets"),
    );
    const read = new Map(records.map((record, n) => [record, budgetsRead[n]!]));
    // One script call per record, settling its items in order (a lease's tickets together), at
    // most SETTLE_ITEMS_PER_CALL each so that no call holds Redis for long.
    type Group = { budgets: string; reservationId: string; items: typeof reading };
    const groups = new Map<string, Group>();
    const settling: Array<[string, Group]> = [];
    for (const r of reading) {
      const [err, budgets] = read.get(r.record)!;
      if (err) out[r.k] = err;
      else if (budgets === null) out[r.k] = { outcome: "unknown" };
      else {
        let group = groups.get(r.record);
        if (!group || group.items.length === SETTLE_ITEMS_PER_CALL) {
          group = { budgets: budgets as string, reservationId: r.reservationId, items: [] };
          groups.set(r.record, group);
          settling.push([r.record, group]);
        }
        group.items.push(r);
      }
    }
    const replies = await pipelined(
      redis,
      settling,
      ([record]) => record,
      (p, [, { budgets, reservationId, items: its }]) => {
        const args = its.map(({ item, ticket }) => ({ cost: item.cost, eventId: item.eventId, ticket }));
        (p as SettlePipeline).authSettle(...settleArgs(reservationId, budgets, args, now));
      },
    );
    settling.forEach(([, { items: its }], n) => {
      const [err, reply] = replies[n]!;
      its.forEach(({ k, item }, j) => {
        out[k] = err ?? settled(item, (reply as SettleReply[] | null)?.[j]);
      });
    });
    return out.map((r) => r ?? new Error("not settled"));
  };
}
