import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { collectDefaultMetrics, Gauge, Registry } from "prom-client";
import { RemoteError, StatusError } from "./grpc.js";

export { Counter, Gauge, Histogram, Registry } from "prom-client";

/** Prefix of every metric name Tollgate exposes. */
export const METRIC_PREFIX = "tollgate_";

/**
 * Histogram buckets in seconds for in-process work and calls between services: from 1 ms to 10 s.
 */
export const FAST_SECONDS_BUCKETS: readonly number[] = [
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

/** Histogram buckets in seconds for model calls and whole requests: from 10 ms to 5 min. */
export const SLOW_SECONDS_BUCKETS: readonly number[] = [
  0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
];

/**
 * How often, in ms, the event-loop delay behind `tollgate_nodejs_eventloop_lag_{min,max,mean,
 * stddev,p50,p90,p99}_seconds` is sampled. prom-client samples every 10 ms, which wakes every
 * process 100 times a second, idle or not: about 8 ms of CPU a second per process on these
 * machines, nearly all an idle service's CPU (docs/operations.md, "Idle CPU").
 */
export const EVENT_LOOP_SAMPLE_MS = 100;

/** An interval longer than any process lives (the largest a libuv timer takes): a sampler that never wakes. */
const PARKED_SAMPLER_MS = 2 ** 31 - 1;

/** The delay gauges, by name suffix, with prom-client's help texts. */
const DELAY_GAUGES = {
  min: "The minimum recorded event loop delay.",
  max: "The maximum recorded event loop delay.",
  mean: "The mean of the recorded event loop delays.",
  stddev: "The standard deviation of the recorded event loop delays.",
  p50: "The 50th percentile of the recorded event loop delays.",
  p90: "The 90th percentile of the recorded event loop delays.",
  p99: "The 99th percentile of the recorded event loop delays.",
} as const;

/**
 * Replaces prom-client's event-loop delay gauges with the same names, sampled every
 * EVENT_LOOP_SAMPLE_MS. Node's sampler records the time between two of its ticks, the interval
 * included; prom-client reports that as is, so that an idle process reads 0.01 s. These report
 * only the delay beyond the interval (an idle process reads about 0), so a p99 above ~0.1 s
 * still means a saturated replica (docs/runbooks/api-edge.md). As in prom-client, the first
 * gauge's collection fills all seven and starts a new window for the next scrape.
 */
function sampleEventLoopDelay(registry: Registry): void {
  const sampler = monitorEventLoopDelay({ resolution: EVENT_LOOP_SAMPLE_MS });
  sampler.enable();
  const intervalNs = EVENT_LOOP_SAMPLE_MS * 1e6;
  const beyond = (ns: number) => (sampler.count > 0 ? Math.max(0, ns - intervalNs) / 1e9 : 0);
  const gauges = new Map<keyof typeof DELAY_GAUGES, Gauge>();
  for (const [suffix, help] of Object.entries(DELAY_GAUGES) as Array<[keyof typeof DELAY_GAUGES, string]>) {
    const name = `${METRIC_PREFIX}nodejs_eventloop_lag_${suffix}_seconds`;
    registry.removeSingleMetric(name);
    const first = gauges.size === 0;
    gauges.set(
      suffix,
      new Gauge({
        name,
        help,
        registers: [registry],
        collect: first
          ? () => {
              gauges.get("min")?.set(beyond(sampler.min));
              gauges.get("max")?.set(beyond(sampler.max));
              gauges.get("mean")?.set(beyond(sampler.mean));
              gauges.get("stddev")?.set(sampler.count > 0 ? sampler.stddev / 1e9 : 0);
              gauges.get("p50")?.set(beyond(sampler.percentile(50)));
              gauges.get("p90")?.set(beyond(sampler.percentile(90)));
              gauges.get("p99")?.set(beyond(sampler.percentile(99)));
              sampler.reset();
            }
          : undefined,
      }),
    );
  }
}

/** Options of createMetrics. */
export interface MetricsOptions {
  /**
   * Registers the process's default metrics (CPU, memory, event loop, GC) and
   * `tollgate_service_info{service}`. Default true; the all-in-one process, whose five services
   * share one process, gives them to one registry only so that the registries can be merged.
   */
  processMetrics?: boolean;
}

/** Creates one service's metric registry (nothing in prom-client's global registry). */
export function createMetrics(service: string, opts: MetricsOptions = {}): Registry {
  const registry = new Registry();
  if (opts.processMetrics ?? true) {
    // prom-client's own delay sampler is parked and its gauges are replaced by sampleEventLoopDelay's.
    collectDefaultMetrics({
      register: registry,
      prefix: METRIC_PREFIX,
      eventLoopMonitoringPrecision: PARKED_SAMPLER_MS,
    });
    sampleEventLoopDelay(registry);
    new Gauge({
      name: `${METRIC_PREFIX}service_info`,
      help: "Always 1; names the service (or all-in-one) this process runs",
      labelNames: ["service"],
      registers: [registry],
    }).set({ service }, 1);
  }
  return registry;
}

/** Merges registries into one for a single endpoint; throws when two define the same metric name. */
export function mergeMetrics(registries: readonly Registry[]): Registry {
  return Registry.merge([...registries]);
}

/** A running metrics endpoint. */
export interface MetricsServer {
  port: number;
  stop(): Promise<void>;
}

/**
 * Serves `GET /metrics` (Prometheus text exposition) on its own port, 404 for anything else.
 * Port 0 picks a free one. Kept off the public port so scrapes never meet callers' traffic.
 */
export async function serveMetrics(registry: Registry, host: string, port: number): Promise<MetricsServer> {
  const server = createServer((req, res) => {
    const path = (req.url ?? "").split("?")[0];
    if (path !== "/metrics" || (req.method !== "GET" && req.method !== "HEAD")) {
      res.writeHead(404, { "content-type": "text/plain; charset=utf-8" }).end("not found\n");
      return;
    }
    registry.metrics().then(
      (text) => {
        res.writeHead(200, { "content-type": registry.contentType });
        res.end(req.method === "HEAD" ? undefined : text);
      },
      () => {
        res.writeHead(500, { "content-type": "text/plain; charset=utf-8" }).end("metrics unavailable\n");
      },
    );
  });
  // A scraper's idle keep-alive connection must not hold shutdown up.
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  return {
    port: (server.address() as AddressInfo).port,
    stop: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/**
 * The outcome label of a failed call: the domain code that a StatusError (thrown by a handler)
 * or a RemoteError (received from a service) carries, else "internal". Codes are closed unions,
 * so the label stays low-cardinality.
 */
export function errorOutcome(err: unknown): string {
  if (err instanceof StatusError) return err.code;
  if (err instanceof RemoteError) return err.code ?? "internal";
  return "internal";
}

/**
 * Wraps the unary handlers of a gRPC service so that each call reports its method name and
 * outcome ("ok" or errorOutcome) to `record`; streaming handlers pass through untouched.
 */
export function countUnaryCalls<H extends object>(
  handlers: H,
  record: (method: string, outcome: string, req: unknown, res: unknown) => void,
): H {
  const wrapped: Record<string, unknown> = {};
  for (const [method, handler] of Object.entries(handlers)) {
    if (typeof handler !== "function") {
      wrapped[method] = handler;
      continue;
    }
    wrapped[method] = (req: unknown, ctx: unknown) => {
      const result: unknown = handler.call(handlers, req, ctx);
      if (!(result instanceof Promise)) return result;
      return result.then(
        (res: unknown) => {
          record(method, "ok", req, res);
          return res;
        },
        (err: unknown) => {
          record(method, errorOutcome(err), req, undefined);
          throw err;
        },
      );
    };
  }
  return wrapped as H;
}
