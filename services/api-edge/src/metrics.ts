import {
  Counter,
  FAST_SECONDS_BUCKETS,
  Gauge,
  Histogram,
  METRIC_PREFIX,
  type Registry,
  SLOW_SECONDS_BUCKETS,
} from "@tollgate/kit/metrics";
import type { FastifyInstance } from "fastify";
import { closedStatus } from "./http/response-log.js";
import type { InferenceClient } from "./routes/context.js";

/**
 * api-edge's Prometheus instruments (docs/operations.md, "Metrics"). Labels are route templates, methods and
 * status codes only: never paths as sent, keys, request ids or bodies.
 */
export interface EdgeMetrics {
  requests: Counter<"route" | "method" | "status">;
  duration: Histogram<"route">;
  overhead: Histogram<"route">;
  sseActive: Gauge;
  /** Seconds each request in flight spent waiting on inference-router, by request id. */
  waits: Map<string, { seconds: number; calls: number }>;
}

/** Registers api-edge's metrics on `registry`. */
export function edgeMetrics(registry: Registry): EdgeMetrics {
  const registers = [registry];
  return {
    requests: new Counter({
      name: `${METRIC_PREFIX}http_requests_total`,
      help: "HTTP requests by route template, method and status (499: the caller went away first)",
      labelNames: ["route", "method", "status"],
      registers,
    }),
    duration: new Histogram({
      name: `${METRIC_PREFIX}http_request_duration_seconds`,
      help: "Time from receiving a request until its response (or stream) ended",
      labelNames: ["route"],
      buckets: [...SLOW_SECONDS_BUCKETS],
      registers,
    }),
    overhead: new Histogram({
      name: `${METRIC_PREFIX}gateway_overhead_seconds`,
      help: "Request time not spent waiting on inference-router, for requests that ran a model",
      labelNames: ["route"],
      buckets: [...FAST_SECONDS_BUCKETS],
      registers,
    }),
    sseActive: new Gauge({
      name: `${METRIC_PREFIX}sse_streams_active`,
      help: "Streamed completions in flight, from the router call until the stream ends",
      registers,
    }),
    waits: new Map(),
  };
}

const seconds = (since: number) => (performance.now() - since) / 1000;

/**
 * Counts and times every request when its response closes: also a stream the caller cut short,
 * which never finishes and so never reaches Fastify's onResponse hooks.
 */
export function countRequests(app: FastifyInstance, m: EdgeMetrics): void {
  app.addHook("onRequest", async (req, reply) => {
    const started = performance.now();
    m.waits.set(req.id, { seconds: 0, calls: 0 });
    reply.raw.once("close", () => {
      const total = seconds(started);
      const wait = m.waits.get(req.id);
      m.waits.delete(req.id);
      // Unmatched paths share one label, so a scan of random URLs cannot grow the series.
      const route = req.routeOptions.url ?? "unmatched";
      const status = String(closedStatus(reply));
      m.requests.inc({ route, method: req.method, status });
      m.duration.observe({ route }, total);
      if (wait && wait.calls > 0) m.overhead.observe({ route }, Math.max(0, total - wait.seconds));
    });
  });
}

/**
 * Wraps the inference-router client so that the time each request waits on it (a buffered
 * call, or each awaited stream event) is added to that request's entry in `m.waits`.
 */
export function timeInference(client: InferenceClient, m: EdgeMetrics): InferenceClient {
  const add = (requestId: string, s: number) => {
    const wait = m.waits.get(requestId);
    if (!wait) return;
    wait.seconds += s;
    wait.calls++;
  };
  return {
    ...client,
    async complete(req, opts) {
      const started = performance.now();
      try {
        return await client.complete(req, opts);
      } finally {
        add(req.input?.requestId ?? "", seconds(started));
      }
    },
    streamComplete(req, opts) {
      const requestId = req.input?.requestId ?? "";
      const stream = client.streamComplete(req, opts);
      return (async function* () {
        m.sseActive.inc();
        const events = stream[Symbol.asyncIterator]();
        const next = async () => {
          const started = performance.now();
          try {
            return await events.next();
          } finally {
            add(requestId, seconds(started));
          }
        };
        try {
          for (let event = await next(); !event.done; event = await next()) yield event.value;
        } finally {
          m.sseActive.dec();
          await events.return?.();
        }
      })();
    },
  };
}
