import { randomUUID } from "node:crypto";
import { type GatewayConfig, pricingSnapshotId } from "@tollgate/config";
import { createJetStreamBus, type EventBus } from "@tollgate/kit/bus";
import { implement, serveGrpc } from "@tollgate/kit/grpc";
import type { HealthCheck } from "@tollgate/kit/health";
import type { Logger } from "@tollgate/kit/log";
import { connectNats, drainNats, type NatsConnection, natsHealth } from "@tollgate/kit/nats";
import { stopInOrder } from "@tollgate/kit/shutdown";
import { InferenceService } from "@tollgate/proto/inference";
import { natsNames } from "@tollgate/proto/subjects";
import { createBusUsagePublisher } from "./adapters/bus-usage-publisher.js";
import { createProviders } from "./adapters/provider-registry.js";
import { Catalog } from "./domain/catalog.js";
import { Inference } from "./domain/inference.js";
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
}

/** A running inference-router. */
export interface InferenceRouter {
  port: number;
  stop(): Promise<void>;
}

/** Builds providers, the catalog and the usage publisher, then serves InferenceService. */
export async function start(
  opts: InferenceRouterOptions,
  log: Logger,
  deps: { bus?: EventBus } = {},
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
  const providers = createProviders(opts.gateway.upstreams, opts.upstreamKeys);
  const inference = new Inference(
    new Catalog(opts.gateway.models, providers),
    createBusUsagePublisher(bus, names.usageRecorded),
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
  log.info({ port: grpc.port }, "inference-router serving");

  return {
    port: grpc.port,
    stop: () =>
      stopInOrder([
        // In-flight streams finish (and publish their usage) before the server goes away.
        () => grpc.stop(20_000),
        () => Promise.all([...providers.values()].map((p) => p.close())),
        () => (nc ? drainNats(nc) : undefined),
      ]),
  };
}
