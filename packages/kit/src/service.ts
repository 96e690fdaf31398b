import type { GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import type { Logger } from "pino";
import type { InternalAuth } from "./credentials.js";
import { type GrpcServer, implement, serveGrpc } from "./grpc.js";
import type { HealthCheck } from "./health.js";
import type { InProcessService } from "./in-process.js";
import { type MetricsServer, type Registry, serveMetrics } from "./metrics.js";
import type { StopDeadline } from "./shutdown.js";

/**
 * The options every gRPC service's start() takes for its servers (auth-policy, inference-router,
 * metering, mpp-payment); each service's options extend them with its own.
 */
export interface ServiceServerOptions {
  grpcHost: string;
  grpcPort: number;
  /**
   * How internal callers authenticate (loadConfig builds it from the environment and refuses
   * to run open unless INTERNAL_AUTH=off). Absent: none, for tests that start the service in process.
   */
  internalAuth?: InternalAuth;
  /** A plaintext port serving only grpc.health.v1, for probes that speak no TLS. */
  grpcHealthPort?: number;
  /** Port of the Prometheus /metrics endpoint (0 picks a free one); absent: no endpoint. */
  metricsPort?: number;
  /** Default 127.0.0.1. */
  metricsHost?: string;
  /**
   * Whether a Redis or NATS that cannot be reached at start is waited for (default): the process
   * stays alive and logs one warn per try until it answers (docs/operations.md, "Starting before
   * Redis or NATS"). False: start() fails at once (the all-in-one, which says what to start and exits).
   */
  waitForDependencies?: boolean;
}

/** How a service's start() waits for a dependency, per its options: undefined when it does not. */
export function dependencyWait(
  opts: Pick<ServiceServerOptions, "waitForDependencies">,
  log: Pick<Logger, "warn">,
): { log: Pick<Logger, "warn"> } | undefined {
  return opts.waitForDependencies === false ? undefined : { log };
}

/** What a running gRPC service offers; each service's adds its own. */
export interface RunningService<M extends GenServiceMethods> {
  /** The bound gRPC port. */
  port: number;
  /** The bound /metrics port, when metricsPort was given. */
  metricsPort?: number;
  /** The handlers its gRPC server serves, for a caller in the same process (the all-in-one). */
  inProcess: InProcessService<M>;
  stop(deadline?: StopDeadline): Promise<void>;
}

/** A service's servers, as serveService started them. */
export interface ServiceServers {
  grpc: GrpcServer;
  metrics?: MetricsServer;
}

/**
 * Serves one service's handlers over gRPC (with grpc.health.v1 following `checks`) and, when
 * its options name a port, its metrics: the one way the four gRPC services start serving. When
 * the metrics endpoint cannot bind, the gRPC server is stopped again and the error thrown.
 */
export async function serveService<M extends GenServiceMethods>(
  opts: ServiceServerOptions,
  served: InProcessService<M>,
  extra: { checks: readonly HealthCheck[]; registry: Registry },
): Promise<ServiceServers> {
  const grpc = await serveGrpc({
    host: opts.grpcHost,
    port: opts.grpcPort,
    ...(opts.internalAuth ? { auth: opts.internalAuth } : {}),
    ...(opts.grpcHealthPort !== undefined ? { healthPort: opts.grpcHealthPort } : {}),
    log: served.log,
    checks: extra.checks,
    services: [implement(served.service, served.handlers, served.access)],
  });
  if (opts.metricsPort === undefined) return { grpc };
  try {
    return {
      grpc,
      metrics: await serveMetrics(extra.registry, opts.metricsHost ?? "127.0.0.1", opts.metricsPort),
    };
  } catch (err) {
    await grpc.stop(0).catch(() => {});
    throw err;
  }
}

/** What a service's start() returns of these servers: their ports, its in-process handlers, its stop. */
export function runningService<M extends GenServiceMethods>(
  servers: ServiceServers,
  inProcess: InProcessService<M>,
  stop: (deadline?: StopDeadline) => Promise<void>,
): RunningService<M> {
  return {
    port: servers.grpc.port,
    ...(servers.metrics ? { metricsPort: servers.metrics.port } : {}),
    inProcess,
    stop,
  };
}
