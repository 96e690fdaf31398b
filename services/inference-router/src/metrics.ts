import {
  Counter,
  Histogram,
  METRIC_PREFIX,
  type Registry,
  SLOW_SECONDS_BUCKETS,
} from "@tollgate/kit/metrics";
import type { ClosableProvider } from "./adapters/provider-registry.js";
import { InferenceError } from "./domain/errors.js";
import type { UsageEvent, UsagePublisher } from "./domain/ports.js";

/**
 * inference-router's Prometheus instruments (issue 5, item 7). Labels are configuration values
 * (upstream ids, model ids) and closed sets only: never keys, prompts, accounts or request ids.
 */
export interface RouterMetrics {
  upstreamRequests: Counter<"upstream" | "model" | "outcome">;
  upstreamLatency: Histogram<"upstream" | "model" | "phase">;
  tokens: Counter<"model" | "kind">;
  cost: Counter<"model" | "door">;
  usagePublishFailures: Counter;
}

/** Registers inference-router's metrics on `registry`. */
export function routerMetrics(registry: Registry): RouterMetrics {
  const registers = [registry];
  return {
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
  };
}

function outcomeOf(err: unknown, signal: AbortSignal): string {
  if (signal.aborted) return "cancelled";
  return err instanceof InferenceError ? err.code : "error";
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
  return {
    id: provider.id,
    close: () => provider.close(),
    async complete(req, signal) {
      const labels = labelsOf(req.body);
      const started = performance.now();
      let outcome = "ok";
      try {
        return await provider.complete(req, signal);
      } catch (err) {
        outcome = outcomeOf(err, signal);
        throw err;
      } finally {
        m.upstreamRequests.inc({ ...labels, outcome });
        if (outcome !== "cancelled")
          m.upstreamLatency.observe({ ...labels, phase: "total" }, seconds(started));
      }
    },
    async *stream(req, signal) {
      const labels = labelsOf(req.body);
      const started = performance.now();
      let first = true;
      // Stays "cancelled" when the consumer stops iterating early (the caller went away).
      let outcome = "cancelled";
      try {
        for await (const chunk of provider.stream(req, signal)) {
          if (first) {
            first = false;
            m.upstreamLatency.observe({ ...labels, phase: "ttft" }, seconds(started));
          }
          yield chunk;
        }
        outcome = "ok";
      } catch (err) {
        outcome = outcomeOf(err, signal);
        throw err;
      } finally {
        m.upstreamRequests.inc({ ...labels, outcome });
        if (outcome !== "cancelled")
          m.upstreamLatency.observe({ ...labels, phase: "total" }, seconds(started));
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
