import {
  grpcServerOptions,
  grpcServiceEnv,
  natsServers,
  parseEnv,
  port,
  redisClusterNodes,
  streamReplicas,
} from "@tollgate/kit/config";
import { loadInternalAuth } from "@tollgate/kit/credentials";
import { natsUrlOf } from "@tollgate/kit/nats";
import { redisUrlOf } from "@tollgate/kit/redis";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import { z } from "zod";
import type { MeteringOptions } from "./app.js";

const envSchema = z
  .object({
    ...grpcServiceEnv(50054),
    NATS_URL: z.string().optional(),
    NATS_SERVERS: natsServers,
    NATS_NAMESPACE: z.string().default(""),
    NATS_STREAM_REPLICAS: streamReplicas,
    REDIS_URL: z.string().optional(),
    REDIS_CLUSTER_NODES: redisClusterNodes,
    REDIS_PREFIX: z.string().default("tollgate:"),
    /** Prometheus /metrics; 0 picks a free port. */
    METRICS_HOST: z.string().default("127.0.0.1"),
    METRICS_PORT: port(9054),
    /** auth-policy's gRPC address, for SettleReservations. */
    AUTH_POLICY_ADDR: z.string().default("127.0.0.1:50051"),
    /** mpp-payment's gRPC address(es), for Commit of paid holds; unset or "off": none. */
    MPP_PAYMENT_ADDR: z.string().optional(),
    /** Most usage events applied together. */
    BATCH_MAX_EVENTS: z.coerce.number().int().min(1).max(1000).default(256),
    /** How long a batch waits for more usage events once one is in hand (ms). */
    BATCH_LINGER_MS: z.coerce.number().int().min(0).max(1000).default(100),
    ...otelEnv,
  })
  .refine((e) => natsUrlOf(e.NATS_URL, e.NATS_SERVERS) !== undefined, {
    path: ["NATS_URL"],
    message: "required: URL of the NATS server(s) carrying usage events (or NATS_SERVERS)",
    // Reported together with every other problem, not only once the rest is valid.
    when: () => true,
  })
  .refine((e) => Boolean(e.REDIS_URL || e.REDIS_CLUSTER_NODES), {
    path: ["REDIS_URL"],
    message: "required: URL of the Redis holding usage rollups (or REDIS_CLUSTER_NODES)",
    when: () => true,
  });

/** Everything metering needs to start on its own. */
export interface MeteringConfig extends MeteringOptions {
  logLevel: string;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS). */
  shutdownTimeoutMs: number;
  /** OpenTelemetry export; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
}

/** Reads the environment; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): MeteringConfig {
  const e = parseEnv(envSchema, env);
  return {
    ...grpcServerOptions(e),
    internalAuth: loadInternalAuth(env, { server: true, client: true }),
    logLevel: e.LOG_LEVEL,
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_SECONDS * 1_000,
    natsUrl: natsUrlOf(e.NATS_URL, e.NATS_SERVERS)!,
    natsNamespace: e.NATS_NAMESPACE,
    natsStreamReplicas: e.NATS_STREAM_REPLICAS,
    redisUrl: redisUrlOf(e.REDIS_URL, e.REDIS_CLUSTER_NODES)!,
    redisPrefix: e.REDIS_PREFIX,
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    authPolicyAddr: e.AUTH_POLICY_ADDR,
    ...(e.MPP_PAYMENT_ADDR && e.MPP_PAYMENT_ADDR !== "off" ? { mppPaymentAddr: e.MPP_PAYMENT_ADDR } : {}),
    batchMaxEvents: e.BATCH_MAX_EVENTS,
    batchLingerMs: e.BATCH_LINGER_MS,
    tracing: tracingOptions(e, "metering"),
  };
}
