import { MeteringError } from "./errors.js";

/** The dimensions usage is rolled up by. */
export interface UsageDimensions {
  accountId: string;
  connectionId: string;
  keyId: string;
  model: string;
}

/** One served request's usage, as metering applies it. */
export interface UsageEvent extends UsageDimensions {
  /** Deduplication key: an event with an id already applied changes nothing. */
  eventId: string;
  requestId: string;
  occurredAt: Date;
  inputTokens: number;
  outputTokens: number;
  reasoningTokens: number;
  /** Spend in base units of the payment token. */
  cost: bigint;
  /** The account-door budget reservation this usage settles; undefined when there is none. */
  reservationId?: string;
  /** The paid-door hold this usage is charged to (mpp-payment); undefined on the account door. */
  paidHold?: PaidHold;
}

/** A paid-door hold: mpp-payment's reservation id and the payment channel holding it. */
export interface PaidHold {
  reservationId: string;
  channelId: string;
}

/** Sums of requests, tokens and spend (base units). */
export interface UsageTotals {
  requests: bigint;
  inputTokens: bigint;
  outputTokens: bigint;
  reasoningTokens: bigint;
  cost: bigint;
}

/** Width of one rollup bucket; buckets start at UTC hour or day boundaries. */
export type Granularity = "hour" | "day";

/** Which usage to sum; an absent or empty field matches everything. */
export type UsageFilter = Partial<UsageDimensions>;

/** The usage of one bucket (of one model, when the report is broken down by model). */
export interface UsageBucket {
  start: Date;
  /** Set when the report is broken down by model. */
  model?: string;
  totals: UsageTotals;
}

/** The totals of one dimension combination in one bucket, as a store holds them. */
export interface UsageRow {
  start: Date;
  dims: UsageDimensions;
  totals: UsageTotals;
}

/** Totals over a range and the non-empty buckets that make them up, ordered by start. */
export interface UsageReport {
  totals: UsageTotals;
  buckets: UsageBucket[];
}

/** A validated usage question. */
export interface UsageQuery {
  filter: UsageFilter;
  from: Date;
  to: Date;
  granularity: Granularity;
  /** One bucket per model and period instead of one per period. */
  byModel: boolean;
}

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;
const INT64_MAX = 2n ** 63n - 1n;
const COST = /^(0|[1-9][0-9]*)$/;

/** Bucket width in milliseconds. UTC days have no DST or leap seconds in epoch time. */
export const BUCKET_MS = { hour: HOUR_MS, day: DAY_MS } as const satisfies Record<Granularity, number>;

/** The widest range one query may span: 31 days of hours or 400 days of days. */
export const MAX_RANGE_MS = { hour: 31 * DAY_MS, day: 400 * DAY_MS } as const satisfies Record<
  Granularity,
  number
>;

/** The range a query covers when the caller gives none. */
export const DEFAULT_RANGE_MS = DAY_MS;

/** Start (UTC) of the bucket that holds `at`. */
export function bucketStart(at: Date, granularity: Granularity): Date {
  const width = BUCKET_MS[granularity];
  return new Date(Math.floor(at.getTime() / width) * width);
}

/** Starts of every bucket overlapping [from, to), ascending. */
export function bucketStarts(from: Date, to: Date, granularity: Granularity): Date[] {
  const width = BUCKET_MS[granularity];
  const starts: Date[] = [];
  for (let t = bucketStart(from, granularity).getTime(); t < to.getTime(); t += width)
    starts.push(new Date(t));
  return starts;
}

/** Applies defaults (the last 24 h, hourly) and the range limits to a usage question. */
export function resolveUsageQuery(
  input: { filter: UsageFilter; from?: Date; to?: Date; granularity?: Granularity; byModel?: boolean },
  now: Date,
): UsageQuery {
  const granularity = input.granularity ?? "hour";
  const to = input.to ?? now;
  const from = input.from ?? new Date(to.getTime() - DEFAULT_RANGE_MS);
  if (!(from.getTime() < to.getTime())) {
    throw new MeteringError("invalid_time_range", "from must be before to");
  }
  if (to.getTime() - from.getTime() > MAX_RANGE_MS[granularity]) {
    const days = MAX_RANGE_MS[granularity] / DAY_MS;
    const wider = granularity === "hour" ? `; granularity=day spans up to ${MAX_RANGE_MS.day / DAY_MS}` : "";
    throw new MeteringError(
      "time_range_too_large",
      `granularity=${granularity} spans at most ${days} days${wider}: narrow from/to`,
    );
  }
  return { filter: input.filter, from, to, granularity, byModel: input.byModel ?? false };
}

/** Parses a wire amount (decimal string of base units) that must fit a signed 64-bit integer. */
export function parseCost(value: string): bigint {
  if (!COST.test(value)) throw new MeteringError("invalid_usage_event", "cost is not a decimal integer");
  const cost = BigInt(value);
  if (cost > INT64_MAX) throw new MeteringError("invalid_usage_event", "cost is out of range");
  return cost;
}

/** Checks the fields an event cannot be applied without. */
export function validateUsageEvent(event: UsageEvent): UsageEvent {
  if (event.eventId === "") throw new MeteringError("invalid_usage_event", "event_id is missing");
  if (Number.isNaN(event.occurredAt.getTime())) {
    throw new MeteringError("invalid_usage_event", "occurred_at is missing");
  }
  return event;
}

/** Zero of everything. */
export function emptyTotals(): UsageTotals {
  return { requests: 0n, inputTokens: 0n, outputTokens: 0n, reasoningTokens: 0n, cost: 0n };
}

/** The sum of two totals. */
export function addTotals(a: UsageTotals, b: UsageTotals): UsageTotals {
  return {
    requests: a.requests + b.requests,
    inputTokens: a.inputTokens + b.inputTokens,
    outputTokens: a.outputTokens + b.outputTokens,
    reasoningTokens: a.reasoningTokens + b.reasoningTokens,
    cost: a.cost + b.cost,
  };
}

/** What one event adds to a bucket. */
export function totalsOf(event: UsageEvent): UsageTotals {
  return {
    requests: 1n,
    inputTokens: BigInt(event.inputTokens),
    outputTokens: BigInt(event.outputTokens),
    reasoningTokens: BigInt(event.reasoningTokens),
    cost: event.cost,
  };
}

/** True when `dims` passes `filter`. */
export function matchesFilter(filter: UsageFilter, dims: UsageDimensions): boolean {
  return (
    (!filter.accountId || filter.accountId === dims.accountId) &&
    (!filter.connectionId || filter.connectionId === dims.connectionId) &&
    (!filter.keyId || filter.keyId === dims.keyId) &&
    (!filter.model || filter.model === dims.model)
  );
}

/** A stable, unambiguous string for a dimension combination ("|" never occurs inside a part). */
export function dimensionsKey(d: UsageDimensions): string {
  return [d.accountId, d.connectionId, d.keyId, d.model].map(encodeURIComponent).join("|");
}

/** The inverse of dimensionsKey. */
export function parseDimensionsKey(key: string): UsageDimensions {
  const [accountId = "", connectionId = "", keyId = "", model = ""] = key.split("|").map(decodeURIComponent);
  return { accountId, connectionId, keyId, model };
}

/**
 * Sums a store's rows that pass `filter` into a report: one bucket per period (or per period and
 * model), empty buckets dropped, ordered by start and then model.
 */
export function reportOf(rows: Iterable<UsageRow>, filter: UsageFilter, byModel: boolean): UsageReport {
  const sums = new Map<string, UsageBucket>();
  for (const row of rows) {
    if (!matchesFilter(filter, row.dims)) continue;
    const id = byModel ? `${row.start.getTime()}|${row.dims.model}` : String(row.start.getTime());
    const bucket = sums.get(id);
    if (bucket) bucket.totals = addTotals(bucket.totals, row.totals);
    else
      sums.set(id, {
        start: row.start,
        ...(byModel ? { model: row.dims.model } : {}),
        totals: row.totals,
      });
  }
  const kept = [...sums.values()]
    .filter((b) => b.totals.requests > 0n)
    .sort((a, b) => a.start.getTime() - b.start.getTime() || (a.model ?? "").localeCompare(b.model ?? ""));
  return { totals: kept.reduce((sum, b) => addTotals(sum, b.totals), emptyTotals()), buckets: kept };
}
