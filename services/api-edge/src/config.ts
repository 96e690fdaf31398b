import { loadGatewayConfig } from "@tollgate/config";
import { logLevel, parseEnv, port, redisClusterNodes, shutdownTimeoutSeconds } from "@tollgate/kit/config";
import { type InternalAuth, loadInternalAuth } from "@tollgate/kit/credentials";
import { redisUrlOf } from "@tollgate/kit/redis";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import { z } from "zod";
import type { AdminServerOptions } from "./admin/server.js";
import { RESPONSE_ITEMS_TTL_MS } from "./domain/response-items.js";
import { DEFAULT_LIMITS, type EdgeLimits } from "./http/limits.js";
import type { PaidOffer } from "./openapi/payment-info.js";

const positiveInt = (fallback: number) => z.coerce.number().int().positive().default(fallback);

/**
 * The public port's limits (docs/account-door.md, "Limits"), read by api-edge and by the all-in-one process,
 * which runs the same public port.
 */
export const limitsEnvSchema = z
  .object({
    BODY_LIMIT_BYTES: positiveInt(DEFAULT_LIMITS.bodyLimitBytes),
    MAX_JSON_DEPTH: positiveInt(DEFAULT_LIMITS.maxJsonDepth),
    MAX_MESSAGES: positiveInt(DEFAULT_LIMITS.maxMessages),
    MAX_HEADER_BYTES: positiveInt(DEFAULT_LIMITS.maxHeaderBytes),
    HEADERS_TIMEOUT_MS: positiveInt(DEFAULT_LIMITS.headersTimeoutMs),
    REQUEST_TIMEOUT_MS: positiveInt(DEFAULT_LIMITS.requestTimeoutMs),
    CONNECTION_TIMEOUT_MS: positiveInt(DEFAULT_LIMITS.connectionTimeoutMs),
    /** 0: unlimited. */
    MAX_CONNECTIONS: z.coerce.number().int().min(0).default(DEFAULT_LIMITS.maxConnections),
  })
  .refine((e) => e.HEADERS_TIMEOUT_MS <= e.REQUEST_TIMEOUT_MS, {
    path: ["HEADERS_TIMEOUT_MS"],
    message: "must not exceed REQUEST_TIMEOUT_MS",
  });

/** The limits of a parsed limitsEnvSchema. */
export function limitsOf(e: z.output<typeof limitsEnvSchema>): EdgeLimits {
  return {
    bodyLimitBytes: e.BODY_LIMIT_BYTES,
    maxJsonDepth: e.MAX_JSON_DEPTH,
    maxMessages: e.MAX_MESSAGES,
    maxHeaderBytes: e.MAX_HEADER_BYTES,
    headersTimeoutMs: e.HEADERS_TIMEOUT_MS,
    requestTimeoutMs: e.REQUEST_TIMEOUT_MS,
    connectionTimeoutMs: e.CONNECTION_TIMEOUT_MS,
    maxConnections: e.MAX_CONNECTIONS,
  };
}

/** How long a Responses answer's output message is kept for later `item_reference` inputs (api-edge, all-in-one). */
export const responseItemsEnv = {
  RESPONSE_ITEMS_TTL_SECONDS: positiveInt(RESPONSE_ITEMS_TTL_MS / 1000),
};

const envSchema = z.object({
  HOST: z.string().default("127.0.0.1"),
  PORT: port(8080),
  AUTH_POLICY_ADDR: z.string().default("127.0.0.1:50051"),
  /** One address, a comma list or a dns:/// target (calls spread over every replica). */
  INFERENCE_ROUTER_ADDR: z.string().default("127.0.0.1:50053"),
  /** The paid door's mpp-payment; "off" disables the paid route. */
  MPP_PAYMENT_ADDR: z.string().default("127.0.0.1:50052"),
  LOG_LEVEL: logLevel,
  SHUTDOWN_TIMEOUT_SECONDS: shutdownTimeoutSeconds,
  /** Redis for idempotency records shared by every replica; unset keeps them in memory. */
  REDIS_URL: z.string().optional(),
  REDIS_CLUSTER_NODES: redisClusterNodes,
  REDIS_PREFIX: z.string().default("tollgate:"),
  ...responseItemsEnv,
  /** The admin API's own port (never the public one); it starts only when ADMIN_TOKEN is set. */
  ADMIN_HOST: z.string().default("127.0.0.1"),
  ADMIN_PORT: port(8081),
  /** Secret, no default: unset (or empty) keeps the admin API off. */
  ADMIN_TOKEN: z.string().min(16, "must be at least 16 characters").optional(),
  /** metering's gRPC address: the admin API's usage reports, and recording the usage of a stream whose router was lost. */
  METERING_ADDR: z.string().default("127.0.0.1:50054"),
  /** Prometheus /metrics on its own port, never the public one; 0 picks a free port. */
  METRICS_HOST: z.string().default("127.0.0.1"),
  METRICS_PORT: port(9080),
  /** Account-door requests admitted on leases (docs/money.md, "Leases"); "off": each authorized alone. */
  ACCOUNT_LEASES: z.enum(["on", "off"]).default("on"),
  /**
   * The Tollgate configuration file, read only for the paid door's plans and prices that
   * GET /openapi.json shows; unset: the document lists none (the 402 challenge still prices).
   */
  TOLLGATE_CONFIG: z.string().optional(),
  ...otelEnv,
});

/** Everything api-edge needs to start. */
export interface ApiEdgeConfig {
  host: string;
  port: number;
  authPolicyAddr: string;
  inferenceRouterAddr: string;
  /** This process's credential toward the internal services. */
  internalAuth: InternalAuth;
  mppPaymentAddr?: string;
  meteringAddr: string;
  limits: EdgeLimits;
  /** Absent: no ADMIN_TOKEN, so the admin server does not start. */
  admin?: AdminServerOptions;
  redisUrl?: string;
  redisPrefix: string;
  /** How long a Responses output message is kept (RESPONSE_ITEMS_TTL_SECONDS). */
  responseItemsTtlMs: number;
  logLevel: string;
  /** The bound on the process's stop (SHUTDOWN_TIMEOUT_SECONDS). */
  shutdownTimeoutMs: number;
  metricsHost: string;
  metricsPort: number;
  /** OpenTelemetry export; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
  /** Whether account-door requests are admitted on leases (ACCOUNT_LEASES). */
  leases: boolean;
  /** The paid door's plans and prices (TOLLGATE_CONFIG), for the OpenAPI document. */
  offer?: PaidOffer;
}

/** The plans and model prices of the configuration file: all the document needs of it. */
function offerOf(path: string): PaidOffer {
  const { plans, models } = loadGatewayConfig(path);
  return { plans, models };
}

/** Reads the environment; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): ApiEdgeConfig {
  const e = parseEnv(envSchema.and(limitsEnvSchema), env);
  const redisUrl = redisUrlOf(e.REDIS_URL, e.REDIS_CLUSTER_NODES);
  return {
    host: e.HOST,
    port: e.PORT,
    authPolicyAddr: e.AUTH_POLICY_ADDR,
    inferenceRouterAddr: e.INFERENCE_ROUTER_ADDR,
    internalAuth: loadInternalAuth(env, { server: false, client: true }),
    ...(e.MPP_PAYMENT_ADDR !== "off" ? { mppPaymentAddr: e.MPP_PAYMENT_ADDR } : {}),
    meteringAddr: e.METERING_ADDR,
    limits: limitsOf(e),
    ...(e.ADMIN_TOKEN
      ? {
          admin: {
            host: e.ADMIN_HOST,
            port: e.ADMIN_PORT,
            token: e.ADMIN_TOKEN,
            meteringAddr: e.METERING_ADDR,
          },
        }
      : {}),
    ...(redisUrl ? { redisUrl } : {}),
    redisPrefix: e.REDIS_PREFIX,
    responseItemsTtlMs: e.RESPONSE_ITEMS_TTL_SECONDS * 1000,
    logLevel: e.LOG_LEVEL,
    shutdownTimeoutMs: e.SHUTDOWN_TIMEOUT_SECONDS * 1_000,
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    tracing: tracingOptions(e, "api-edge"),
    leases: e.ACCOUNT_LEASES === "on",
    ...(e.TOLLGATE_CONFIG ? { offer: offerOf(e.TOLLGATE_CONFIG) } : {}),
  };
}
