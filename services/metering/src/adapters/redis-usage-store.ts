import { clusterTag, type Redis } from "@tollgate/kit/redis";
import type { UsageStore } from "../domain/ports.js";
import {
  addTotals,
  bucketStart,
  bucketStarts,
  dimensionsKey,
  emptyTotals,
  type Granularity,
  matchesFilter,
  parseDimensionsKey,
  toReport,
  type UsageTotals,
} from "../domain/usage.js";

/** Options of the Redis store. */
export interface RedisUsageStoreOptions {
  /** Prefix of every key this store touches. Default "tollgate:". */
  prefix?: string;
  /** How long an applied event id is remembered. Default 7 days, far beyond any redelivery. */
  eventTtlSeconds?: number;
}

// Dedupe and every increment of one event in one script, so a crash or a redelivery can never
// count an event twice or half. Cost goes through HINCRBY as an integer string: base units fit
// int64, and no floating point touches money. The dims sets list the dimension combinations
// present in a bucket, so a query can find the rollup hashes without SCAN.
//   KEYS: event id, hour dims set, hour rollup, day dims set, day rollup
//   ARGV: ttl seconds, dims member, input tokens, output tokens, reasoning tokens, cost
const RECORD_LUA = `
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
for i = 2, 4, 2 do
  redis.call('SADD', KEYS[i], ARGV[2])
  redis.call('HINCRBY', KEYS[i + 1], 'requests', 1)
  redis.call('HINCRBY', KEYS[i + 1], 'input_tokens', ARGV[3])
  redis.call('HINCRBY', KEYS[i + 1], 'output_tokens', ARGV[4])
  redis.call('HINCRBY', KEYS[i + 1], 'reasoning_tokens', ARGV[5])
  redis.call('HINCRBY', KEYS[i + 1], 'cost', ARGV[6])
end
return 1
`;

type WithRecord = Redis & {
  meteringRecordUsage(...args: Array<string | number>): Promise<number>;
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
 * The usage store over Redis: keys `<prefix>metering:…`, one Lua script per event. On a Redis
 * Cluster the keys are `<prefix>metering:{usage}:…`, one slot: an event's script and a query's
 * pipelines touch the rollups of several buckets together.
 */
export function createRedisUsageStore(redis: Redis, opts: RedisUsageStoreOptions = {}): UsageStore {
  const prefix = `${opts.prefix ?? "tollgate:"}metering:${clusterTag(redis, "usage")}`;
  const ttl = opts.eventTtlSeconds ?? 7 * 24 * 3_600;
  const client = redis as WithRecord;
  if (typeof client.meteringRecordUsage !== "function") {
    client.defineCommand("meteringRecordUsage", { numberOfKeys: 5, lua: RECORD_LUA });
  }

  const bucketId = (g: Granularity, start: Date) => `${prefix}${g}:${start.getTime() / 1000}`;
  const dimsSet = (g: Granularity, start: Date) => `${bucketId(g, start)}:dims`;
  const rollup = (g: Granularity, start: Date, dims: string) => `${bucketId(g, start)}:${dims}`;

  return {
    async record(event) {
      const dims = dimensionsKey(event);
      const hour = bucketStart(event.occurredAt, "hour");
      const day = bucketStart(event.occurredAt, "day");
      const applied = await client.meteringRecordUsage(
        `${prefix}event:${event.eventId}`,
        dimsSet("hour", hour),
        rollup("hour", hour, dims),
        dimsSet("day", day),
        rollup("day", day, dims),
        ttl,
        dims,
        event.inputTokens,
        event.outputTokens,
        event.reasoningTokens,
        event.cost.toString(),
      );
      return applied === 1 ? "recorded" : "duplicate";
    },

    async query(filter, from, to, granularity) {
      const starts = bucketStarts(from, to, granularity);
      const members = results<string[]>(
        await starts.reduce((p, start) => p.smembers(dimsSet(granularity, start)), redis.pipeline()).exec(),
      );
      const wanted = starts.flatMap((start, i) =>
        (members[i] ?? [])
          .filter((dims) => matchesFilter(filter, parseDimensionsKey(dims)))
          .map((dims) => ({ start, key: rollup(granularity, start, dims) })),
      );
      const hashes =
        wanted.length === 0
          ? []
          : results<Record<string, string>>(
              await wanted.reduce((p, w) => p.hgetall(w.key), redis.pipeline()).exec(),
            );
      const byStart = new Map<number, UsageTotals>();
      wanted.forEach((w, i) => {
        const t = totalsFromHash(hashes[i] ?? {});
        byStart.set(w.start.getTime(), addTotals(byStart.get(w.start.getTime()) ?? emptyTotals(), t));
      });
      return toReport([...byStart].map(([ms, totals]) => ({ start: new Date(ms), totals })));
    },
  };
}
