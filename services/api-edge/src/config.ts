import { logLevel, parseEnv, port } from "@tollgate/kit/config";
import { otelEnv, type TracingOptions, tracingOptions } from "@tollgate/kit/tracing";
import { z } from "zod";
import type { AdminServerOptions } from "./admin/server.js";

const envSchema = z.object({
  HOST: z.string().default("0.0.0.0"),
  PORT: port(8080),
  AUTH_POLICY_ADDR: z.string().default("127.0.0.1:50051"),
  /** One address, a comma list (round-robin) or a dns:/// target. */
  INFERENCE_ROUTER_ADDR: z.string().default("127.0.0.1:50053"),
  /** The paid door's mpp-payment; "off" disables the paid route. */
  MPP_PAYMENT_ADDR: z.string().default("127.0.0.1:50052"),
  BODY_LIMIT_BYTES: z.coerce
    .number()
    .int()
    .positive()
    .default(4 * 1024 * 1024),
  LOG_LEVEL: logLevel,
  /** Redis for idempotency records shared by every replica; unset keeps them in memory. */
  REDIS_URL: z.string().optional(),
  REDIS_PREFIX: z.string().default("tollgate:"),
  /** The admin API's own port (never the public one); it starts only when ADMIN_TOKEN is set. */
  ADMIN_HOST: z.string().default("127.0.0.1"),
  ADMIN_PORT: port(8081),
  /** Secret, no default: unset (or empty) keeps the admin API off. */
  ADMIN_TOKEN: z.string().min(16, "must be at least 16 characters").optional(),
  /** metering's gRPC address, for the admin API's usage reports. */
  METERING_ADDR: z.string().default("127.0.0.1:50054"),
  /** Prometheus /metrics on its own port, never the public one; 0 picks a free port. */
  METRICS_HOST: z.string().default("0.0.0.0"),
  METRICS_PORT: port(9080),
  ...otelEnv,
});

/** Everything api-edge needs to start. */
export interface ApiEdgeConfig {
  host: string;
  port: number;
  authPolicyAddr: string;
  inferenceRouterAddr: string;
  mppPaymentAddr?: string;
  bodyLimitBytes: number;
  /** Absent: no ADMIN_TOKEN, so the admin server does not start. */
  admin?: AdminServerOptions;
  redisUrl?: string;
  redisPrefix: string;
  logLevel: string;
  metricsHost: string;
  metricsPort: number;
  /** OpenTelemetry export; undefined (the default) keeps tracing off. */
  tracing?: TracingOptions;
}

/** Reads the environment; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): ApiEdgeConfig {
  const e = parseEnv(envSchema, env);
  return {
    host: e.HOST,
    port: e.PORT,
    authPolicyAddr: e.AUTH_POLICY_ADDR,
    inferenceRouterAddr: e.INFERENCE_ROUTER_ADDR,
    ...(e.MPP_PAYMENT_ADDR !== "off" ? { mppPaymentAddr: e.MPP_PAYMENT_ADDR } : {}),
    bodyLimitBytes: e.BODY_LIMIT_BYTES,
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
    ...(e.REDIS_URL ? { redisUrl: e.REDIS_URL } : {}),
    redisPrefix: e.REDIS_PREFIX,
    logLevel: e.LOG_LEVEL,
    metricsHost: e.METRICS_HOST,
    metricsPort: e.METRICS_PORT,
    tracing: tracingOptions(e, "api-edge"),
  };
}
