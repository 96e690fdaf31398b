import { fileURLToPath } from "node:url";
import type { EdgeLimits } from "@tollgate/api-edge";
import { limitsEnvSchema, limitsOf, responseItemsEnv } from "@tollgate/api-edge/config";
import { logLevel, parseEnv, port, shutdownTimeoutSeconds } from "@tollgate/kit/config";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import { z } from "zod";

/** The demo configuration shipped in the repository. */
export const DEMO_CONFIG_PATH = fileURLToPath(
  new URL("../../../deploy/config/tollgate.yaml", import.meta.url),
);

const envSchema = z.object({
  HOST: z.string().default("127.0.0.1"),
  PORT: port(8080),
  TOLLGATE_CONFIG: z.string().optional(),
  REDIS_URL: z.string().optional(),
  NATS_URL: z.string().optional(),
  NATS_NAMESPACE: z.string().default(""),
  REDIS_PREFIX: z.string().default("tollgate:"),
  ...responseItemsEnv,
  /** The Tempo JSON-RPC endpoint; unset starts the bundled devnet. */
  TEMPO_RPC_URL: z.string().optional(),
  /** Port of the bundled devnet (0 picks a free one). */
  TEMPO_DEVNET_PORT: port(18545),
  /** HMAC key of payment challenges (≥ 32 bytes); unset makes a random one for this process. */
  MPP_SECRET: z.string().min(32).optional(),
  /** Payee key that signs settle and close; unset uses the devnet's demo payee with the bundled devnet. */
  MPP_PAYEE_KEY: z
    .string()
    .regex(/^0x[0-9a-fA-F]{64}$/)
    .optional(),
  LOG_LEVEL: logLevel,
  SHUTDOWN_TIMEOUT_SECONDS: shutdownTimeoutSeconds,
  /** One Prometheus /metrics for all five services; loopback like HOST by default; 0 picks a free port. */
  METRICS_HOST: z.string().default("127.0.0.1"),
  METRICS_PORT: port(9090),
  /** Secret, no default: set it (≥ 16 characters) to serve the admin API on 127.0.0.1:ADMIN_PORT. */
  ADMIN_TOKEN: z.string().min(16, "must be at least 16 characters").optional(),
  ADMIN_PORT: port(8081),
  ...otelEnv,
});

/** Settings of the all-in-one process. */
export interface AllInOneConfig {
  host: string;
  port: number;
  /** Absent: the demo configuration with the bundled fake upstream. */
  configPath?: string;
  redisUrl?: string;
  natsUrl?: string;
  natsNamespace: string;
  redisPrefix: string;
  /** How long a Responses output message is kept (RESPONSE_ITEMS_TTL_SECONDS); absent: 24 h. */
  responseItemsTtlMs?: number;
  logLevel: string;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS). */
  shutdownTimeoutMs: number;
  tempoRpcUrl?: string;
  tempoDevnetPort: number;
  mppSecret?: string;
  mppPayeeKey?: `0x${string}`;
  /** Port of the merged /metrics endpoint (0 picks a free one); absent: no endpoint. */
  metricsPort?: number;
  /** Default 127.0.0.1. */
  metricsHost?: string;
  adminToken?: string;
  /** Default 8081; used only with an admin token. */
  adminPort?: number;
  /** The public port's limits (api-edge's BODY_LIMIT_BYTES, MAX_JSON_DEPTH, ...); absent: defaults. */
  limits?: EdgeLimits;
  /** OpenTelemetry export of all five services' spans; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
  /** Environment the inference-router reads upstream API keys from. */
  env: NodeJS.ProcessEnv;
}

/** Reads the environment; every setting has an embedded default. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): AllInOneConfig {
  const e = parseEnv(envSchema.and(limitsEnvSchema), env);
  return {
    host: e.HOST,
    port: e.PORT,
    ...(e.TOLLGATE_CONFIG ? { configPath: e.TOLLGATE_CONFIG } : {}),
    ...(e.REDIS_URL ? { redisUrl: e.REDIS_URL } : {}),
    ...(e.NATS_URL ? { natsUrl: e.NATS_URL } : {}),
    natsNamespace: e.NATS_NAMESPACE,
    redisPrefix: e.REDIS_PREFIX,
    responseItemsTtlMs: e.RESPONSE_ITEMS_TTL_SECONDS * 1000,
    logLevel: e.LOG_LEVEL,
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_SECONDS * 1_000,
    ...(e.TEMPO_RPC_URL ? { tempoRpcUrl: e.TEMPO_RPC_URL } : {}),
    tempoDevnetPort: e.TEMPO_DEVNET_PORT,
    ...(e.ADMIN_TOKEN ? { adminToken: e.ADMIN_TOKEN } : {}),
    adminPort: e.ADMIN_PORT,
    ...(e.MPP_SECRET ? { mppSecret: e.MPP_SECRET } : {}),
    ...(e.MPP_PAYEE_KEY ? { mppPayeeKey: e.MPP_PAYEE_KEY as `0x${string}` } : {}),
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    limits: limitsOf(e),
    tracing: tracingOptions(e, "tollgate-all-in-one"),
    env,
  };
}
