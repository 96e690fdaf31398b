import { randomUUID } from "node:crypto";
import { type GatewayConfig, pricingSnapshotId, upstreamPolicy } from "@tollgate/config";
import { createJetStreamBus, type EventBus } from "@tollgate/kit/bus";
import { DEFAULT_SHUTDOWN_TIMEOUT_MS } from "@tollgate/kit/config";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { HealthCheck } from "@tollgate/kit/health";
import type { InProcessService } from "@tollgate/kit/in-process";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type Registry } from "@tollgate/kit/metrics";
import { connectNats, drainNats, type NatsConnection, natsHealth } from "@tollgate/kit/nats";
import {
  dependencyWait,
  type RunningService,
  runningService,
  type ServiceServerOptions,
  type ServiceServers,
  serveService,
} from "@tollgate/kit/service";
import { stopInOrder } from "@tollgate/kit/shutdown";
import { InferenceService } from "@tollgate/proto/inference";
import { natsNames } from "@tollgate/proto/subjects";
import { createBusUsagePublisher } from "./adapters/bus-usage-publisher.js";
import { createMemoryCooldownBroadcast } from "./adapters/memory-cooldown-broadcast.js";
import { createNatsCooldownBroadcast } from "./adapters/nats-cooldown-broadcast.js";
import { createProviders, upstreamProbe } from "./adapters/provider-registry.js";
import { Catalog } from "./domain/catalog.js";
import { Cooldowns } from "./domain/cooldowns.js";
import { type FailoverMember, FailoverProvider } from "./domain/failover.js";
import { Inference } from "./domain/inference.js";
import type { CooldownBroadcast } from "./domain/ports.js";
import {
  countCooldown,
  countProbe,
  failoverObserver,
  instrumentProvider,
  instrumentPublisher,
  routerMetrics,
} from "./metrics.js";
import { inferenceAccess } from "./transport/grpc/access.js";
import { inferenceHandlers } from "./transport/grpc/handlers.js";

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface InferenceRouterOptions extends ServiceServerOptions {
  gateway: GatewayConfig;
  upstreamKeys: Readonly<Record<string, string>>;
  /** Required unless a bus is passed in. */
  natsUrl?: string;
  natsNamespace?: string;
  /** Replicas of the usage stream on a NATS cluster (created so, or raised to it). Default 1. */
  natsStreamReplicas?: number;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS); sets what streams get of it. */
  shutdownTimeoutMs?: number;
}

/**
 * What the stop leaves a stream's usage event and the NATS drain once the streams in flight have
 * ended or been cut (ms): a publish that NATS answers takes milliseconds.
 */
export const AFTER_STREAMS_MS = 5_000;

/**
 * How long the stop lets streams in flight go on (ms): the process's bound less AFTER_STREAMS_MS,
 * so that a stream the grace period was chosen for (up to the upstream timeout, when the chart's
 * grace period allows it) finishes, and one cut at the end is still recorded before the exit.
 */
export function streamGraceMs(shutdownTimeoutMs = DEFAULT_SHUTDOWN_TIMEOUT_MS): number {
  return Math.max(0, shutdownTimeoutMs - AFTER_STREAMS_MS);
}

/** A running inference-router. */
export type InferenceRouter = RunningService<MethodsOf<typeof InferenceService>>;

/** Dependencies the caller already owns: the all-in-one process passes its in-memory bus. */
export interface InferenceRouterDeps {
  bus?: EventBus;
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
  /** How cooldowns reach the other replicas; default: core NATS, or nobody without NATS. */
  cooldowns?: CooldownBroadcast;
}

export {
  createMemoryCooldownBroadcast,
  type MemoryCooldownBroadcast,
} from "./adapters/memory-cooldown-broadcast.js";

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** Builds providers, the catalog and the usage publisher, then serves InferenceService. */
export async function start(
  opts: InferenceRouterOptions,
  log: Logger,
  deps: InferenceRouterDeps = {},
): Promise<InferenceRouter> {
  const names = natsNames(opts.natsNamespace);
  let nc: NatsConnection | undefined;
  let bus = deps.bus;
  const checks: HealthCheck[] = [];
  if (!bus) {
    if (!opts.natsUrl) throw new Error("inference-router needs NATS_URL (or an injected bus)");
    nc = await connectNats(opts.natsUrl, "inference-router", dependencyWait(opts, log));
    checks.push(natsHealth(nc));
    bus = await createJetStreamBus(nc, {
      name: names.usageStream,
      subjects: [names.usageSubjects],
      replicas: opts.natsStreamReplicas ?? 1,
    });
  }
  const registry = deps.metrics ?? createMetrics("inference-router");
  const metrics = routerMetrics(registry);
  const { resilience, upstreams } = opts.gateway;
  const providers = new Map(
    [...createProviders(upstreams, resilience, opts.upstreamKeys)].map(([id, p]) => [
      id,
      instrumentProvider(p, metrics),
    ]),
  );
  const policies = new Map(upstreams.map((u) => [u.id, upstreamPolicy(resilience, u)]));
  // Cooldowns are shared by broadcast, never read from a store on the request path.
  const broadcast =
    deps.cooldowns ??
    (nc
      ? createNatsCooldownBroadcast(nc, names.upstreamCooldown, randomUUID())
      : createMemoryCooldownBroadcast().replica());
  const cooldowns = new Cooldowns(new Map([...policies].map(([id, p]) => [id, p.cooldown])), {
    now: Date.now,
    probe: upstreamProbe(providers),
    onCooledDown: (notice) => {
      countCooldown(metrics, notice);
      broadcast.publish(notice);
      log.warn(
        { upstream: notice.upstreamId, reason: notice.reason, durationMs: notice.durationMs },
        "upstream cooled down",
      );
    },
    onProbed: (notice) => {
      countProbe(metrics, notice);
      if (notice.result === "ok")
        log.info(
          { upstream: notice.upstreamId },
          "upstream answered its probe: its failures no longer count",
        );
      else log.warn({ upstream: notice.upstreamId, failure: notice.failure }, "upstream failed its probe");
    },
  });
  const unsubscribe = broadcast.subscribe((notice) => {
    cooldowns.apply(notice);
    log.info(
      { upstream: notice.upstreamId, durationMs: notice.durationMs },
      "upstream cooled down by another replica",
    );
  });
  metrics.watchCooldowns(cooldowns);
  const observer = failoverObserver(metrics);
  const compose = (model: string, members: FailoverMember[]) =>
    new FailoverProvider(model, members, {
      cooldowns,
      retry: resilience.retry,
      // The request's deadline: the longest total timeout among the model's upstreams.
      deadlineMs: Math.max(...members.map((m) => policies.get(m.provider.id)!.timeouts.totalMs)),
      now: Date.now,
      random: Math.random,
      sleep,
      observer,
    });
  const inference = new Inference(
    new Catalog(opts.gateway.models, providers, compose),
    instrumentPublisher(
      createBusUsagePublisher(bus, { recorded: names.usageRecorded, batch: names.usageBatch }, { log }),
      metrics,
    ),
    pricingSnapshotId(opts.gateway.models),
    () => `evt_${randomUUID()}`,
    (over) => {
      metrics.overQuote.inc({ model: over.model, door: over.door });
      metrics.overQuoteBaseUnits.inc(
        { model: over.model, door: over.door },
        Number(over.uncapped - over.quote),
      );
      // The upstream answered more than it was asked for: a misbehaving upstream (no content logged).
      log.warn(
        {
          requestId: over.requestId,
          model: over.model,
          upstream: over.upstreamId,
          cost: over.uncapped.toString(),
          charged: over.quote.toString(),
        },
        "upstream produced more than the quote covers; charged the quote",
      );
    },
  );

  const inProcess: InProcessService<MethodsOf<typeof InferenceService>> = {
    service: InferenceService,
    handlers: inferenceHandlers(inference),
    access: inferenceAccess,
    log,
  };
  let servers: ServiceServers | undefined;
  // Stops what was started so far, in order; stop() and a start that fails to serve share it.
  const stop = () =>
    stopInOrder([
      // In-flight streams finish (and publish their usage) before the server goes away.
      () => servers?.grpc.stop(streamGraceMs(opts.shutdownTimeoutMs)),
      () => Promise.all([...providers.values()].map((p) => p.close())),
      () => unsubscribe(),
      () => (nc ? drainNats(nc) : undefined),
      () => servers?.metrics?.stop(),
    ]);
  try {
    servers = await serveService(opts, inProcess, { checks, registry });
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
  log.info({ port: servers.grpc.port, metricsPort: servers.metrics?.port }, "inference-router serving");
  return runningService(servers, inProcess, stop);
}
