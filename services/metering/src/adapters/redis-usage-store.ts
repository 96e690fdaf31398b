import { clusterTag, type Redis } from "@tollgate/kit/redis";
import type { RecordOutcome, UsageStore } from "../domain/ports.js";
import {
  bucketStart,
  bucketStarts,
  dimensionsKey,
  type Granularity,
  matchesFilter,
  parseDimensionsKey,
  reportOf,
  type UsageDimensions,
  type UsageEvent,
  type UsageTotals,
} from "../domain/usage.js";

const GRANULARITIES: readonly Granularity[] = ["hour", "day"];

/** Options of the Redis store. */
export interface RedisUsageStoreOptions {
  /** Prefix of every key this store touches. Default "tollgate:". */
  prefix?: string;
  /** How long an applied event id is remembered. Default 7 days, far beyond any redelivery. */
  eventTtlSeconds?: number;
}

// Layout, under <prefix>metering: (every key one script touches carries its account's hash
// tag {a:<account>}, so a script never spans Redis Cluster slots)
//   {a:<account>}:event:<event id>              "1" while the event id is remembered (dedupe)
//   {a:<account>}:<hour|day>:<start s>:<dims>   HASH requests, input_tokens, output_tokens,
//                                               reasoning_tokens, cost (one rollup)
//   <hour|day>:<start s>:dims                   SET of the dims present in the bucket (queries
//                                               find the rollups through it, without SCAN)
// Rollups written before the hash tags, <hour|day>:<start s>:<dims>, are still read.
//
// One script applies the events of one account in a batch: for each event, in order, the dedupe
// key is set if absent, and only then does the event count, so a redelivered or repeated event
// changes nothing and no event counts half. Token and request sums are added once per rollup
// (each below 2^53 however big the batch: tokens are uint32); cost goes through HINCRBY per
// event as an integer string, so no floating point touches money.
//   KEYS: n event keys, then the batch's distinct rollup keys
//   ARGV: ttl seconds, n, then per event: its hour rollup and day rollup (1-based among the
//         rollup keys), input tokens, output tokens, reasoning tokens, cost
//   Returns: per event 1 (recorded) or 0 (duplicate)
const RECORD_BATCH_LUA = `
local ttl, n = ARGV[1], tonumber(ARGV[2])
local sums = {}
local out = {}
for i = 1, n do
  local a = 3 + (i - 1) * 6
  if redis.call('SET', KEYS[i], '1', 'NX', 'EX', ttl) then
    out[i] = 1
    for r = a, a + 1 do
      local k = tonumber(ARGV[r])
      local t = sums[k]
      if not t then
        t = { 0, 0, 0, 0 }
        sums[k] = t
      end
      t[1] = t[1] + 1
      t[2] = t[2] + tonumber(ARGV[a + 2])
      t[3] = t[3] + tonumber(ARGV[a + 3])
      t[4] = t[4] + tonumber(ARGV[a + 4])
      if ARGV[a + 5] ~= '0' then redis.call('HINCRBY', KEYS[n + k], 'cost', ARGV[a + 5]) end
    end
  else
    out[i] = 0
  end
end
for k, t in pairs(sums) do
  local key = KEYS[n + k]
  redis.call('HINCRBY', key, 'requests', string.format('%d', t[1]))
  redis.call('HINCRBY', key, 'input_tokens', string.format('%d', t[2]))
  redis.call('HINCRBY', key, 'output_tokens', string.format('%d', t[3]))
  redis.call('HINCRBY', key, 'reasoning_tokens', string.format('%d', t[4]))
end
return out
`;

type RecordPipeline = ReturnType<Redis["pipeline"]> & {
  meteringRecordBatch(numKeys: number, ...args: Array<string | number>): RecordPipeline;
};

type WithRecord = Redis & {
  meteringRecordBatch(numKeys: number, ...args: Array<string | number>): Promise<number[]>;
};

type PipelineResult = Array<[Error | null, unknown]> | null;

function results<T>(res: PipelineResult): T[] {
  if (!res) throw new Error("redis pipeline aborted");
  return res.map(([err, value]) => {
    if (err) throw err;
    return value as T;
  });
}

function totalsFromHash(h: Record<string, string>): UsageTotals {
  return {
    requests: BigInt(h["requests"] ?? "0"),
    inputTokens: BigInt(h["input_tokens"] ?? "0"),
    outputTokens: BigInt(h["output_tokens"] ?? "0"),
    reasoningTokens: BigInt(h["reasoning_tokens"] ?? "0"),
    cost: BigInt(h["cost"] ?? "0"),
  };
}

/**
 * The usage store over Redis: keys `<prefix>metering:…`, one Lua script per account and batch.
 * On a Redis Cluster every key is `<prefix>metering:{usage}:…` (the first hash tag of a key is
 * the one that counts, so the accounts' tags no longer split them): a batch's pipeline and a
 * query's span several accounts and buckets, and a cluster serves a pipeline from one slot only.
 */
export function createRedisUsageStore(redis: Redis, opts: RedisUsageStoreOptions = {}): UsageStore {
  const prefix = `${opts.prefix ?? "tollgate:"}metering:${clusterTag(redis, "usage")}`;
  const ttl = opts.eventTtlSeconds ?? 7 * 24 * 3_600;
  const client = redis as WithRecord;
  if (typeof client.meteringRecordBatch !== "function") {
    // No fixed key count: the first argument of each call says how many keys follow.
    client.defineCommand("meteringRecordBatch", { lua: RECORD_BATCH_LUA });
  }

  const bucketId = (g: Granularity, start: Date) => `${g}:${start.getTime() / 1000}`;
  const dimsSet = (g: Granularity, start: Date) => `${prefix}${bucketId(g, start)}:dims`;
  // encodeURIComponent leaves no brace in the tag, and "a:" keeps it non-empty.
  const tag = (accountId: string) => `${prefix}{a:${encodeURIComponent(accountId)}}:`;
  const rollup = (g: Granularity, start: Date, d: UsageDimensions) =>
    `${tag(d.accountId)}${bucketId(g, start)}:${dimensionsKey(d)}`;
  const legacyRollup = (g: Granularity, start: Date, dims: string) =>
    `${prefix}${bucketId(g, start)}:${dims}`;

  /**
   * The whole batch in one round trip: the bucket dims sets first (idempotent SADDs, sent again
   * with every delivery, so a rollup is never left unlisted), then one script per account.
   */
  async function recordMany(events: readonly UsageEvent[]): Promise<Array<RecordOutcome | Error>> {
    if (events.length === 0) return [];
    const members = new Map<string, Set<string>>();
    const groups = new Map<string, { events: number[]; rollups: Map<string, number>; args: string[] }>();
    events.forEach((e, i) => {
      const dims = dimensionsKey(e);
      const account = tag(e.accountId);
      const group = groups.get(account) ?? { events: [], rollups: new Map<string, number>(), args: [] };
      groups.set(account, group);
      group.events.push(i);
      const at: number[] = [];
      for (const g of GRANULARITIES) {
        const start = bucketStart(e.occurredAt, g);
        const set = dimsSet(g, start);
        const m = members.get(set) ?? new Set<string>();
        members.set(set, m.add(dims));
        const key = rollup(g, start, e);
        let k = group.rollups.get(key);
        if (k === undefined) {
          k = group.rollups.size + 1;
          group.rollups.set(key, k);
        }
        at.push(k);
      }
      group.args.push(
        String(at[0]),
        String(at[1]),
        String(e.inputTokens),
        String(e.outputTokens),
        String(e.reasoningTokens),
        e.cost.toString(),
      );
    });
    const pipe = redis.pipeline() as RecordPipeline;
    for (const [set, m] of members) pipe.sadd(set, ...m);
    const ordered = [...groups];
    for (const [account, group] of ordered) {
      const keys = [
        ...group.events.map((i) => `${account}event:${events[i]!.eventId}`),
        ...group.rollups.keys(),
      ];
      pipe.meteringRecordBatch(keys.length, ...keys, ttl, group.events.length, ...group.args);
    }
    const replies = await pipe.exec();
    if (!replies) throw new Error("redis pipeline aborted");
    // A dims set that was not written leaves its rollups unlisted: the whole batch again.
    for (const [err] of replies.slice(0, members.size)) if (err) throw err;
    // Every event is answered below; an Error (its stack) is made only for one that was not.
    const out = new Array<RecordOutcome | Error | undefined>(events.length);
    ordered.forEach(([, group], n) => {
      const [err, reply] = replies[members.size + n] ?? [new Error("no reply"), null];
      group.events.forEach((i, j) => {
        out[i] = err ?? ((reply as number[])[j] === 1 ? "recorded" : "duplicate");
      });
    });
    return Array.from(out, (o) => o ?? new Error("not recorded"));
  }

  return {
    recordMany,

    async record(event) {
      const [outcome] = await recordMany([event]);
      if (outcome instanceof Error || outcome === undefined) throw outcome ?? new Error("not recorded");
      return outcome;
    },

    async query(filter, from, to, granularity, byModel = false) {
      const starts = bucketStarts(from, to, granularity);
      const members = results<string[]>(
        await starts.reduce((p, start) => p.smembers(dimsSet(granularity, start)), redis.pipeline()).exec(),
      );
      const wanted = starts.flatMap((start, i) =>
        (members[i] ?? []).flatMap((key) => {
          const dims = parseDimensionsKey(key);
          if (!matchesFilter(filter, dims)) return [];
          return [
            { start, dims, key: rollup(granularity, start, dims) },
            { start, dims, key: legacyRollup(granularity, start, key) },
          ];
        }),
      );
      const hashes =
        wanted.length === 0
          ? []
          : results<Record<string, string>>(
              await wanted.reduce((p, w) => p.hgetall(w.key), redis.pipeline()).exec(),
            );
      return reportOf(
        wanted.map((w, i) => ({ start: w.start, dims: w.dims, totals: totalsFromHash(hashes[i] ?? {}) })),
        filter,
        byModel,
      );
    },
  };
}
