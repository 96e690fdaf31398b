import { randomUUID } from "node:crypto";
import { type GatewayConfig, pricingSnapshotId } from "@tollgate/config";
import { createJetStreamBus, type EventBus } from "@tollgate/kit/bus";
import { implement, serveGrpc } from "@tollgate/kit/grpc";
import type { HealthCheck } from "@tollgate/kit/health";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type MetricsServer, type Registry, serveMetrics } from "@tollgate/kit/metrics";
import { connectNats, drainNats, type NatsConnection, natsHealth } from "@tollgate/kit/nats";
import { stopInOrder } from "@tollgate/kit/shutdown";
import { InferenceService } from "@tollgate/proto/inference";
import { natsNames } from "@tollgate/proto/subjects";
import { createBusUsagePublisher } from "./adapters/bus-usage-publisher.js";
import { createProviders } from "./adapters/provider-registry.js";
import { Catalog } from "./domain/catalog.js";
import { Inference } from "./domain/inference.js";
import { instrumentProvider, instrumentPublisher, routerMetrics } from "./metrics.js";
import { inferenceHandlers } from "./transport/grpc/handlers.js";

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface InferenceRouterOptions {
  grpcHost: string;
  grpcPort: number;
  gateway: GatewayConfig;
  upstreamKeys: Readonly<Record<string, string>>;
  /** Required unless a bus is passed in. */
  natsUrl?: string;
  natsNamespace?: string;
  /** Port of the Prometheus /metrics endpoint (0 picks a free one); absent: no endpoint. */
  metricsPort?: number;
  /** Default 0.0.0.0. */
  metricsHost?: string;
}

/** A running inference-router. */
export interface InferenceRouter {
  port: number;
  /** The bound /metrics port, when metricsPort was given. */
  metricsPort?: number;
  stop(): Promise<void>;
}

/** Dependencies the caller already owns: the all-in-one process passes its in-memory bus. */
export interface InferenceRouterDeps {
  bus?: EventBus;
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
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
    nc = await connectNats(opts.natsUrl, "inference-router");
    checks.push(natsHealth(nc));
    bus = await createJetStreamBus(nc, { name: names.usageStream, subjects: [names.usageSubjects] });
  }
  const registry = deps.metrics ?? createMetrics("inference-router");
  const metrics = routerMetrics(registry);
  const providers = new Map(
    [...createProviders(opts.gateway.upstreams, opts.upstreamKeys)].map(([id, p]) => [
      id,
      instrumentProvider(p, metrics),
    ]),
  );
  const inference = new Inference(
    new Catalog(opts.gateway.models, providers),
    instrumentPublisher(createBusUsagePublisher(bus, names.usageRecorded), metrics),
    pricingSnapshotId(opts.gateway.models),
    () => `evt_${randomUUID()}`,
  );

  const grpc = await serveGrpc({
    host: opts.grpcHost,
    port: opts.grpcPort,
    log,
    checks,
    services: [implement(InferenceService, inferenceHandlers(inference))],
  });
  let metricsServer: MetricsServer | undefined;
  const stop = () =>
    stopInOrder([
      // In-flight streams finish (and publish their usage) before the server goes away.
      () => grpc.stop(20_000),
      () => Promise.all([...providers.values()].map((p) => p.close())),
      () => (nc ? drainNats(nc) : undefined),
      () => metricsServer?.stop(),
    ]);
  if (opts.metricsPort !== undefined) {
    try {
      metricsServer = await serveMetrics(registry, opts.metricsHost ?? "0.0.0.0", opts.metricsPort);
    } catch (err) {
      await stop().catch(() => {});
      throw err;
    }
  }
  log.info({ port: grpc.port, metricsPort: metricsServer?.port }, "inference-router serving");

  return {
    port: grpc.port,
    ...(metricsServer ? { metricsPort: metricsServer.port } : {}),
    stop,
  };
}
