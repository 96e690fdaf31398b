import { logLevel, parseEnv, port } from "@tollgate/kit/config";
import { z } from "zod";

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
});

/** Everything api-edge needs to start. */
export interface ApiEdgeConfig {
  host: string;
  port: number;
  authPolicyAddr: string;
  inferenceRouterAddr: string;
  mppPaymentAddr?: string;
  bodyLimitBytes: number;
  logLevel: string;
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
    logLevel: e.LOG_LEVEL,
  };
}
