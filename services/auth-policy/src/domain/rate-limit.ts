// Rate limits (docs/contract.md, "Limits": 429 per key, connection, account or route).
//
// Algorithm: a sliding window over one-second buckets. Each window (one scope × one unit) keeps
// a count per second; a request at second `s` sees the units counted in seconds s-60 … s
// (61 buckets) and is admitted when `used + cost <= limit` in EVERY applicable window. Only then
// is its cost added to the bucket of second `s` in each window; a refused request adds nothing.
// Because the 61 buckets cover any 60-second interval that ends at the admission, no 60 s
// interval ever admits more than the limit; a unit frees up between 60 and 61 s after use.
// Requests count 1; tokens count the request's estimated input plus its effective output cap.

import { AuthError, type RateLimitInfo } from "./errors.js";
import type {
  AccountRecord,
  ConnectionPolicy,
  RateDecision,
  RateLimits,
  RateScope,
  RateUnit,
  RateWindow,
  RouteName,
  WindowCount,
} from "./ports.js";

/** Width of one bucket. */
export const BUCKET_MS = 1_000;
/** Buckets a window looks at: the current second and the 60 before it. */
export const WINDOW_BUCKETS = 61;

/** Counts one window from its buckets (bucket index → units) for a request of `cost` at `nowMs`. */
export function countWindow(
  buckets: Iterable<readonly [number, number]>,
  limit: number,
  cost: number,
  nowMs: number,
): WindowCount {
  const oldest = Math.floor(nowMs / BUCKET_MS) - WINDOW_BUCKETS + 1;
  const live: Array<readonly [number, number]> = [];
  let used = 0;
  let newestBucket = -1;
  for (const [bucket, units] of buckets) {
    if (bucket < oldest) continue;
    live.push([bucket, units]);
    used += units;
    if (units > 0 && bucket > newestBucket) newestBucket = bucket;
  }
  if (used + cost <= limit) return { used, newestBucket, retryAfterMs: 0 };
  if (cost > limit) return { used, newestBucket, retryAfterMs: -1 };
  // The request fits once enough of the oldest buckets have left the window.
  live.sort((a, b) => a[0] - b[0]);
  let freed = 0;
  for (const [bucket, units] of live) {
    freed += units;
    if (used - freed + cost <= limit) {
      return { used, newestBucket, retryAfterMs: (bucket + WINDOW_BUCKETS) * BUCKET_MS - nowMs };
    }
  }
  return { used, newestBucket, retryAfterMs: -1 };
}

/** A window's state after the decision, as reported to the caller. */
export interface WindowState {
  window: RateWindow;
  remaining: number;
  /** Ms until every unit counted has left the window. */
  resetMs: number;
  retryAfterMs: number;
}

/** Remaining units and reset time of each window once the decision is applied. */
export function windowStates(windows: readonly RateWindow[], decision: RateDecision): WindowState[] {
  const currentBucket = Math.floor(decision.nowMs / BUCKET_MS);
  return windows.map((window, i) => {
    const count = decision.counts[i] ?? { used: 0, newestBucket: -1, retryAfterMs: 0 };
    const counted = decision.admitted && window.cost > 0;
    const used = count.used + (counted ? window.cost : 0);
    const newest = counted ? currentBucket : count.newestBucket;
    return {
      window,
      remaining: Math.max(0, window.limit - used),
      resetMs: newest < 0 ? 0 : (newest + WINDOW_BUCKETS) * BUCKET_MS - decision.nowMs,
      retryAfterMs: count.retryAfterMs,
    };
  });
}

/**
 * The windows of one request: account, connection, key and route, requests and tokens. The key's
 * windows are its rotation lineage's (keys.ts, lineageOf), as its budget is: a rotated key and its
 * successor share one allowance during the grace, never one each.
 */
export function windowsFor(args: {
  account?: AccountRecord;
  connection: ConnectionPolicy;
  keyLineageId: string;
  route?: RouteName;
  tokens: number;
}): RateWindow[] {
  const { connection: c, keyLineageId, route, tokens } = args;
  // The `{accountId}` hash tag keeps every window of one request in one Redis Cluster slot.
  const tag = `{${c.accountId}}`;
  const windows: RateWindow[] = [];
  const add = (scope: RateScope, id: string, limits: RateLimits | undefined) => {
    if (limits?.requestsPerMinute !== undefined) {
      windows.push({
        id: `${tag}:${id}:requests`,
        scope,
        unit: "requests",
        limit: limits.requestsPerMinute,
        cost: 1,
      });
    }
    if (limits?.tokensPerMinute !== undefined) {
      windows.push({
        id: `${tag}:${id}:tokens`,
        scope,
        unit: "tokens",
        limit: limits.tokensPerMinute,
        cost: tokens,
      });
    }
  };
  add("account", "account", args.account?.limits);
  add("connection", `connection:${c.connectionId}`, c.limits.connection);
  add("key", `key:${keyLineageId}`, c.limits.perKey);
  if (route) add("route", `route:${c.connectionId}/${route}`, c.limits.routes[route]);
  return windows;
}

const SCOPE_TEXT: Record<RateScope, string> = {
  account: "this account",
  connection: "this connection",
  key: "this key",
  route: "this route",
};

const seconds = (ms: number) => Math.max(0, Math.ceil(ms / 1_000));

/** Refuses, before anything is counted, a request whose tokens can never fit a window. */
export function assertFitsAtAll(windows: readonly RateWindow[]): void {
  for (const w of windows) {
    if (w.cost > w.limit) {
      throw new AuthError(
        "tokens_above_rate_limit",
        `the request's ${w.cost} tokens (input estimate plus output cap) exceed the limit of ${w.limit} ${w.unit} per minute for ${SCOPE_TEXT[w.scope]}; lower max_tokens`,
      );
    }
  }
}

/**
 * Turns a decision into the caller's answer: throws "rate_limited" with the numbers of the
 * window that frees up last, or returns the window closest to exhaustion (for RateLimit-*).
 */
export function settle(windows: readonly RateWindow[], decision: RateDecision): RateLimitStatus | undefined {
  const states = windowStates(windows, decision);
  if (!decision.admitted) {
    const refusing = states.filter((s) => s.retryAfterMs !== 0);
    const worst = (refusing.length > 0 ? refusing : states).reduce((a, b) =>
      b.retryAfterMs > a.retryAfterMs ? b : a,
    );
    const info: RateLimitInfo = {
      limit: worst.window.limit,
      remaining: worst.remaining,
      resetSeconds: seconds(worst.resetMs),
      retryAfterSeconds: Math.max(1, seconds(worst.retryAfterMs)),
      scope: worst.window.scope,
      unit: worst.window.unit,
    };
    throw new AuthError(
      "rate_limited",
      `rate limit of ${info.limit} ${info.unit} per minute for ${SCOPE_TEXT[info.scope]} reached; retry in ${info.retryAfterSeconds} s`,
      info,
    );
  }
  if (states.length === 0) return undefined;
  const tightest = states.reduce((a, b) =>
    b.remaining / b.window.limit < a.remaining / a.window.limit ? b : a,
  );
  return {
    limit: tightest.window.limit,
    remaining: tightest.remaining,
    resetSeconds: seconds(tightest.resetMs),
    scope: tightest.window.scope,
    unit: tightest.window.unit,
  };
}

/** One window's numbers after an admitted request. */
export interface RateLimitStatus {
  limit: number;
  remaining: number;
  resetSeconds: number;
  scope: RateScope;
  unit: RateUnit;
}
