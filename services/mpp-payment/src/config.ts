import { logLevel, parseEnv, port } from "@tollgate/kit/config";
import { z } from "zod";

const envSchema = z.object({
  GRPC_HOST: z.string().default("0.0.0.0"),
  GRPC_PORT: port(50052),
  LOG_LEVEL: logLevel,
});

/** Everything mpp-payment needs to start. */
export interface MppPaymentConfig {
  grpcHost: string;
  grpcPort: number;
  logLevel: string;
}

/** Reads the environment; throws ConfigError naming every problem. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): MppPaymentConfig {
  const e = parseEnv(envSchema, env);
  return { grpcHost: e.GRPC_HOST, grpcPort: e.GRPC_PORT, logLevel: e.LOG_LEVEL };
}
