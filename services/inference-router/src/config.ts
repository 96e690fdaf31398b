import { type GatewayConfig, loadGatewayConfig } from "@tollgate/config";
import {
  grpcServerOptions,
  grpcServiceEnv,
  natsServers,
  parseEnv,
  port,
  streamReplicas,
} from "@tollgate/kit/config";
import { type InternalAuth, loadInternalAuth } from "@tollgate/kit/credentials";
import { natsUrlOf } from "@tollgate/kit/nats";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import { z } from "zod";

const envSchema = z
  .object({
    TOLLGATE_CONFIG: z.string().min(1, "path of the Tollgate configuration file"),
    ...grpcServiceEnv(50053),
    NATS_URL: z.string().optional(),
    NATS_SERVERS: natsServers,
    NATS_NAMESPACE: z.string().default(""),
    NATS_STREAM_REPLICAS: streamReplicas,
    /** Prometheus /metrics; 0 picks a free port. */
    METRICS_HOST: z.string().default("127.0.0.1"),
    METRICS_PORT: port(9053),
    ...otelEnv,
  })
  .refine((e) => natsUrlOf(e.NATS_URL, e.NATS_SERVERS) !== undefined, {
    path: ["NATS_URL"],
    message: "NATS URL for usage events (or NATS_SERVERS)",
    // Reported together with every other problem, not only once the rest is valid.
    when: () => true,
  });

/** Everything inference-router needs to start. */
export interface InferenceRouterConfig {
  grpcHost: string;
  grpcPort: number;
  grpcHealthPort?: number;
  /** How internal callers authenticate. */
  internalAuth: InternalAuth;
  natsUrl: string;
  natsNamespace: string;
  natsStreamReplicas: number;
  logLevel: string;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS). */
  shutdownTimeoutMs: number;
  metricsHost: string;
  metricsPort: number;
  gateway: GatewayConfig;
  /** Upstream API keys by upstream id, read from the variables the config file names. */
  upstreamKeys: Record<string, string>;
  /** OpenTelemetry export; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
}

/** Reads the environment and the configuration file; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): InferenceRouterConfig {
  const e = parseEnv(envSchema, env);
  const gateway = loadGatewayConfig(e.TOLLGATE_CONFIG);
  return {
    ...grpcServerOptions(e),
    internalAuth: loadInternalAuth(env, { server: true, client: false }),
    natsUrl: natsUrlOf(e.NATS_URL, e.NATS_SERVERS)!,
    natsNamespace: e.NATS_NAMESPACE,
    natsStreamReplicas: e.NATS_STREAM_REPLICAS,
    logLevel: e.LOG_LEVEL,
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_SECONDS * 1_000,
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    gateway,
    upstreamKeys: upstreamKeysFrom(gateway, env),
    tracing: tracingOptions(e, "inference-router"),
  };
}

/** Collects each upstream's API key from the environment variable its `apiKeyEnv` names. */
export function upstreamKeysFrom(gateway: GatewayConfig, env: NodeJS.ProcessEnv): Record<string, string> {
  const keys: Record<string, string> = {};
  for (const u of gateway.upstreams) {
    const value = u.apiKeyEnv ? env[u.apiKeyEnv] : undefined;
    if (value) keys[u.id] = value;
  }
  return keys;
}
