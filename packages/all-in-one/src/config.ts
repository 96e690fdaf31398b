import { fileURLToPath } from "node:url";
import { logLevel, parseEnv, port } from "@tollgate/kit/config";
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
  LOG_LEVEL: logLevel,
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
  logLevel: string;
  /** Environment the inference-router reads upstream API keys from. */
  env: NodeJS.ProcessEnv;
}

/** Reads the environment; every setting has an embedded default. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env): AllInOneConfig {
  const e = parseEnv(envSchema, env);
  return {
    host: e.HOST,
    port: e.PORT,
    ...(e.TOLLGATE_CONFIG ? { configPath: e.TOLLGATE_CONFIG } : {}),
    ...(e.REDIS_URL ? { redisUrl: e.REDIS_URL } : {}),
    ...(e.NATS_URL ? { natsUrl: e.NATS_URL } : {}),
    natsNamespace: e.NATS_NAMESPACE,
    redisPrefix: e.REDIS_PREFIX,
    logLevel: e.LOG_LEVEL,
    env,
  };
}
