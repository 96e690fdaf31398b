import {
  Counter,
  Gauge,
  Histogram,
  METRIC_PREFIX,
  type Registry,
  SLOW_SECONDS_BUCKETS,
} from "@tollgate/kit/metrics";
import type { ClosableProvider } from "./adapters/provider-registry.js";
import type { Cooldowns, ProbeNotice } from "./domain/cooldowns.js";
import { InferenceError } from "./domain/errors.js";
import type { FailoverObserver } from "./domain/failover.js";
import type { CooldownNotice, UsageEvent, UsagePublisher } from "./domain/ports.js";

/**
 * inference-router's Prometheus instruments (docs/operations.md, "Metrics"). Labels are configuration values
 * (upstream ids, model ids) and closed sets only: never keys, prompts, accounts or request ids.
 */
export interface RouterMetrics {
  upstreamRequests: Counter<"upstream" | "model" | "outcome">;
  upstreamLatency: Histogram<"upstream" | "model" | "phase">;
  tokens: Counter<"model" | "kind">;
  cost: Counter<"model" | "door">;
  usagePublishFailures: Counter;
  overQuote: Counter<"model" | "door">;
  overQuoteBaseUnits: Counter<"model" | "door">;
  upstreamAttempts: Counter<"upstream" | "outcome">;
  retries: Counter<"model" | "upstream">;
  fallbacks: Counter<"model" | "from" | "to">;
  cooldownsStarted: Counter<"upstream" | "reason">;
  cooldownProbes: Counter<"upstream" | "result">;
  /** Reports the cooldown state of `cooldowns`' upstreams at every scrape. */
  watchCooldowns(cooldowns: Cooldowns): void;
}

/** Registers inference-router's metrics on `registry`. */
export function routerMetrics(registry: Registry): RouterMetrics {
  const registers = [registry];
  let cooldowns: Cooldowns | undefined;
  new Gauge({
    name: `${METRIC_PREFIX}upstream_cooldown`,
    help: "1 while this replica skips the upstream (cooled down here or by another replica), else 0",
    labelNames: ["upstream"],
    registers,
    collect() {
      for (const upstream of cooldowns?.upstreamIds ?? [])
        this.set({ upstream }, cooldowns?.isCooledDown(upstream) ? 1 : 0);
    },
  });
  return {
    watchCooldowns(c) {
      cooldowns = c;
    },
    upstreamAttempts: new Counter({
      name: `${METRIC_PREFIX}upstream_attempts_total`,
      help: "Attempts at an upstream by outcome: ok, cancelled, connect_error, timeout, idle_timeout, total_timeout, status_429, status_5xx, status_auth, status_4xx, interrupted, error",
      labelNames: ["upstream", "outcome"],
      registers,
    }),
    retries: new Counter({
      name: `${METRIC_PREFIX}upstream_retries_total`,
      help: "Attempts after the first of one request, by public model id and the upstream tried",
      labelNames: ["model", "upstream"],
      registers,
    }),
    fallbacks: new Counter({
      name: `${METRIC_PREFIX}upstream_fallbacks_total`,
      help: "Retries that moved to another upstream than the attempt before, by public model id",
      labelNames: ["model", "from", "to"],
      registers,
    }),
    cooldownsStarted: new Counter({
      name: `${METRIC_PREFIX}upstream_cooldowns_total`,
      help: "Cooldowns this replica started, by upstream and reason (failures, retry_after)",
      labelNames: ["upstream", "reason"],
      registers,
    }),
    cooldownProbes: new Counter({
      name: `${METRIC_PREFIX}upstream_cooldown_probe_total`,
      help: "Probes this replica sent an upstream before cooling it down, by upstream and result: ok (answered: not cooled down, its failures no longer count), failed",
      labelNames: ["upstream", "result"],
      registers,
    }),
    upstreamRequests: new Counter({
      name: `${METRIC_PREFIX}upstream_requests_total`,
      help: "Upstream calls by upstream, upstream model id and outcome (ok, cancelled, or the error code)",
      labelNames: ["upstream", "model", "outcome"],
      registers,
    }),
    upstreamLatency: new Histogram({
      name: `${METRIC_PREFIX}upstream_latency_seconds`,
      help: "Upstream latency: phase ttft until a stream's first chunk, total until the answer or stream ends",
      labelNames: ["upstream", "model", "phase"],
      buckets: [...SLOW_SECONDS_BUCKETS],
      registers,
    }),
    tokens: new Counter({
      name: `${METRIC_PREFIX}tokens_total`,
      help: "Tokens of recorded usage by public model id and kind (input, output, reasoning)",
      labelNames: ["model", "kind"],
      registers,
    }),
    cost: new Counter({
      name: `${METRIC_PREFIX}cost_base_units_total`,
      help: "Cost of recorded usage in base units of the payment token (6 decimals), by model and door",
      labelNames: ["model", "door"],
      registers,
    }),
    usagePublishFailures: new Counter({
      name: `${METRIC_PREFIX}usage_publish_failures_total`,
      help: "Usage events that could not be published after every retry",
      registers,
    }),
    overQuote: new Counter({
      name: `${METRIC_PREFIX}usage_over_quote_total`,
      help: "Requests whose upstream produced more than their quote covers; each was charged its quote",
      labelNames: ["model", "door"],
      registers,
    }),
    overQuoteBaseUnits: new Counter({
      name: `${METRIC_PREFIX}usage_over_quote_base_units_total`,
      help: "Cost above the quote of such requests, not charged to anyone (base units)",
      labelNames: ["model", "door"],
      registers,
    }),
  };
}

/** How one attempt ended: ok, cancelled (the caller went away), or the error it threw. */
type Ending = "ok" | "cancelled" | { err: unknown };

/**
 * The two outcome labels of an attempt: the error code (upstream_requests_total) and how the
 * attempt failed (upstream_attempts_total: InferenceError.upstream's kind).
 */
function outcomesOf(ending: Ending, signal: AbortSignal): { code: string; kind: string } {
  if (ending === "ok" || ending === "cancelled") return { code: ending, kind: ending };
  if (signal.aborted) return { code: "cancelled", kind: "cancelled" };
  const { err } = ending;
  return err instanceof InferenceError
    ? { code: err.code, kind: err.upstream?.kind ?? "error" }
    : { code: "error", kind: "error" };
}

/** Counts retries and fallbacks. */
export function failoverObserver(m: RouterMetrics): FailoverObserver {
  return {
    retry: (model, upstream) => m.retries.inc({ model, upstream }),
    fallback: (model, from, to) => m.fallbacks.inc({ model, from, to }),
  };
}

/** Counts a cooldown this replica started. */
export function countCooldown(m: RouterMetrics, notice: CooldownNotice): void {
  m.cooldownsStarted.inc({ upstream: notice.upstreamId, reason: notice.reason });
}

/** Counts a probe this replica sent. */
export function countProbe(m: RouterMetrics, notice: ProbeNotice): void {
  m.cooldownProbes.inc({ upstream: notice.upstreamId, result: notice.result });
}

const seconds = (since: number) => (performance.now() - since) / 1000;

/**
 * Times and counts every call to one upstream. The model label is the upstream model id the
 * request names (set from the configuration by the router, never by the caller).
 */
export function instrumentProvider(provider: ClosableProvider, m: RouterMetrics): ClosableProvider {
  const labelsOf = (body: Record<string, unknown>) => ({
    upstream: provider.id,
    model: typeof body.model === "string" ? body.model : "",
  });
  const count = (labels: ReturnType<typeof labelsOf>, ending: Ending, signal: AbortSignal, since: number) => {
    const { code, kind } = outcomesOf(ending, signal);
    m.upstreamRequests.inc({ ...labels, outcome: code });
    m.upstreamAttempts.inc({ upstream: provider.id, outcome: kind });
    if (code !== "cancelled") m.upstreamLatency.observe({ ...labels, phase: "total" }, seconds(since));
  };
  return {
    id: provider.id,
    // Probes are counted by upstream_cooldown_probe_total, not as attempts.
    probe: (target) => provider.probe(target),
    close: () => provider.close(),
    async complete(req, signal) {
      const started = performance.now();
      let ending: Ending = "ok";
      try {
        return await provider.complete(req, signal);
      } catch (err) {
        ending = { err };
        throw err;
      } finally {
        count(labelsOf(req.body), ending, signal, started);
      }
    },
    async *stream(req, signal) {
      const labels = labelsOf(req.body);
      const started = performance.now();
      let first = true;
      // Stays "cancelled" when the consumer stops iterating early (the caller went away).
      let ending: Ending = "cancelled";
      try {
        for await (const chunk of provider.stream(req, signal)) {
          if (first) {
            first = false;
            m.upstreamLatency.observe({ ...labels, phase: "ttft" }, seconds(started));
          }
          yield chunk;
        }
        ending = "ok";
      } catch (err) {
        ending = { err };
        throw err;
      } finally {
        count(labels, ending, signal, started);
      }
    },
  };
}

/** Counts the tokens and cost of every usage event once it is stored, and publishes that failed. */
export function instrumentPublisher(publisher: UsagePublisher, m: RouterMetrics): UsagePublisher {
  return {
    async publish(e: UsageEvent) {
      try {
        await publisher.publish(e);
      } catch (err) {
        m.usagePublishFailures.inc();
        throw err;
      }
      m.tokens.inc({ model: e.model, kind: "input" }, e.tokens.inputTokens);
      m.tokens.inc({ model: e.model, kind: "output" }, e.tokens.outputTokens);
      m.tokens.inc({ model: e.model, kind: "reasoning" }, e.tokens.reasoningTokens);
      // Metrics are not money records: Number() may round a huge amount, which is fine for a
      // rate on a dashboard. Spend of record is metering's bigint rollups, never this counter.
      m.cost.inc({ model: e.model, door: e.door }, Number(e.cost));
    },
  };
}
