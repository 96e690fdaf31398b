import { type GatewayConfig, loadGatewayConfig } from "@tollgate/config";
import {
  grpcServerOptions,
  grpcServiceEnv,
  natsServers,
  parseEnv,
  port,
  redisClusterNodes,
} from "@tollgate/kit/config";
import { loadInternalAuth } from "@tollgate/kit/credentials";
import { natsUrlOf } from "@tollgate/kit/nats";
import { redisUrlOf } from "@tollgate/kit/redis";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import { z } from "zod";
import { DEFAULT_KEY_CACHE_TTL_MS } from "./adapters/cached-key-store.js";
import type { AuthPolicyOptions } from "./app.js";
import { DEFAULT_GRACE_SECONDS, MAX_GRACE_SECONDS } from "./domain/admin.js";
import { DEFAULT_RESERVATION_TTL_SECONDS, DEFAULT_SETTLEMENT_WINDOW_SECONDS } from "./domain/budget.js";

const DAY_SECONDS = 86_400;

const envSchema = z
  .object({
    TOLLGATE_CONFIG: z.string().min(1, "path of the Tollgate configuration file"),
    ...grpcServiceEnv(50051),
    /** Unset: accounts, keys and rate-limit counters live in this process only (one replica). */
    REDIS_URL: z.string().optional(),
    REDIS_CLUSTER_NODES: redisClusterNodes,
    REDIS_PREFIX: z.string().default("tollgate:"),
    /** Unset: revocations are not broadcast (fine for one process with no cache in front). */
    NATS_URL: z.string().optional(),
    NATS_SERVERS: natsServers,
    NATS_NAMESPACE: z.string().default(""),
    KEY_ROTATION_GRACE_SECONDS: z.coerce
      .number()
      .int()
      .min(0)
      .max(MAX_GRACE_SECONDS)
      .default(DEFAULT_GRACE_SECONDS),
    /** With Redis: how long a key and its policy are reused; at most 1 000 (the revocation bound). */
    KEY_CACHE_TTL_MS: z.coerce.number().int().min(0).max(1_000).default(DEFAULT_KEY_CACHE_TTL_MS),
    /** Prometheus /metrics; 0 picks a free port. */
    METRICS_HOST: z.string().default("127.0.0.1"),
    METRICS_PORT: port(9051),
    /** How long a budget hold counts without usage; keep it above the longest request. */
    RESERVATION_TTL_SECONDS: z.coerce
      .number()
      .int()
      .min(1)
      .max(DAY_SECONDS)
      .default(DEFAULT_RESERVATION_TTL_SECONDS),
    /** How long late usage can still be settled; at least metering's dedupe window (7 days). */
    SETTLEMENT_WINDOW_SECONDS: z.coerce
      .number()
      .int()
      .min(3_600)
      .max(90 * DAY_SECONDS)
      .default(DEFAULT_SETTLEMENT_WINDOW_SECONDS),
    ...otelEnv,
  })
  .refine((e) => e.SETTLEMENT_WINDOW_SECONDS >= e.RESERVATION_TTL_SECONDS, {
    path: ["SETTLEMENT_WINDOW_SECONDS"],
    message: "must be at least RESERVATION_TTL_SECONDS",
  });

/** Everything auth-policy needs to start. */
export interface AuthPolicyConfig extends AuthPolicyOptions {
  logLevel: string;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS). */
  shutdownTimeoutMs: number;
  gateway: GatewayConfig;
  /** OpenTelemetry export; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
}

/** Reads the environment and the configuration file; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): AuthPolicyConfig {
  const e = parseEnv(envSchema, env);
  const redisUrl = redisUrlOf(e.REDIS_URL, e.REDIS_CLUSTER_NODES);
  const natsUrl = natsUrlOf(e.NATS_URL, e.NATS_SERVERS);
  return {
    ...grpcServerOptions(e),
    internalAuth: loadInternalAuth(env, { server: true, client: false }),
    logLevel: e.LOG_LEVEL,
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_SECONDS * 1_000,
    gateway: loadGatewayConfig(e.TOLLGATE_CONFIG),
    ...(redisUrl ? { redisUrl } : {}),
    redisPrefix: e.REDIS_PREFIX,
    ...(natsUrl ? { natsUrl } : {}),
    natsNamespace: e.NATS_NAMESPACE,
    rotationGraceSeconds: e.KEY_ROTATION_GRACE_SECONDS,
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    reservationTtlSeconds: e.RESERVATION_TTL_SECONDS,
    keyCacheTtlMs: e.KEY_CACHE_TTL_MS,
    settlementWindowSeconds: e.SETTLEMENT_WINDOW_SECONDS,
    tracing: tracingOptions(e, "auth-policy"),
  };
}
