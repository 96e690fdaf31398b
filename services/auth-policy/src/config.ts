import { type GatewayConfig, loadGatewayConfig } from "@tollgate/config";
import { logLevel, parseEnv, port } from "@tollgate/kit/config";
import { z } from "zod";

const envSchema = z.object({
  TOLLGATE_CONFIG: z.string().min(1, "path of the Tollgate configuration file"),
  GRPC_HOST: z.string().default("0.0.0.0"),
  GRPC_PORT: port(50051),
  LOG_LEVEL: logLevel,
});

/** Everything auth-policy needs to start. */
export interface AuthPolicyConfig {
  grpcHost: string;
  grpcPort: number;
  logLevel: string;
  gateway: GatewayConfig;
}

/** Reads the environment and the configuration file; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): AuthPolicyConfig {
  const e = parseEnv(envSchema, env);
  return {
    grpcHost: e.GRPC_HOST,
    grpcPort: e.GRPC_PORT,
    logLevel: e.LOG_LEVEL,
    gateway: loadGatewayConfig(e.TOLLGATE_CONFIG),
  };
}
