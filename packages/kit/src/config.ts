import { z } from "zod";

/** Thrown when configuration is invalid; lists every problem at once. */
export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "ConfigError";
  }
}

/** Formats zod issues as "path: message" lines, prefixed with a source name. */
export function describeIssues(issues: readonly z.core.$ZodIssue[], prefix = ""): string[] {
  return issues.map((issue) => {
    const path = issue.path.map(String).join(".");
    const where = [prefix, path].filter(Boolean).join(path && prefix ? "." : "");
    return `${where || "(root)"}: ${issue.message}`;
  });
}

/** Parses environment variables with a zod object schema; reports every bad key at once. */
export function parseEnv<S extends z.ZodType>(schema: S, env: NodeJS.ProcessEnv): z.output<S> {
  // Empty strings count as unset, as most deployment tools write them for absent values.
  const cleaned = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ""));
  const result = schema.safeParse(cleaned);
  if (!result.success) throw new ConfigError(describeIssues(result.error.issues));
  return result.data;
}

/** A TCP port number from the environment. */
export const port = (fallback: number) => z.coerce.number().int().min(0).max(65535).default(fallback);

/** A log level from the environment. */
export const logLevel = z
  .enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"])
  .default("info");

/** The bound on a process's stop when SHUTDOWN_TIMEOUT_SECONDS is unset (ms). */
export const DEFAULT_SHUTDOWN_TIMEOUT_MS = 25_000;

/**
 * SHUTDOWN_TIMEOUT_SECONDS: how long a process's stop may take before it exits 1 anyway
 * (shutdown.ts). The chart sets it from the pod's grace period, so work the grace period was
 * chosen for (a stream of up to the upstream timeout) can finish; 25 s when unset.
 */
export const shutdownTimeoutSeconds = z.coerce
  .number()
  .int()
  .min(1)
  .max(3_600)
  .default(DEFAULT_SHUTDOWN_TIMEOUT_MS / 1_000);

/**
 * What every gRPC service reads for its server (its address, its probe port, its log level and
 * the bound on its stop), spread into the service's own environment schema.
 */
export const grpcServiceEnv = (defaultPort: number) => ({
  GRPC_HOST: z.string().default("127.0.0.1"),
  /** A plaintext port serving only grpc.health.v1 (probes, with mutual TLS); unset: none. */
  GRPC_HEALTH_PORT: z.coerce.number().int().min(0).max(65535).optional(),
  GRPC_PORT: port(defaultPort),
  LOG_LEVEL: logLevel,
  SHUTDOWN_TIMEOUT_SECONDS: shutdownTimeoutSeconds,
});

/** The server options grpcServiceEnv's variables give. */
export function grpcServerOptions(e: {
  GRPC_HOST: string;
  GRPC_PORT: number;
  GRPC_HEALTH_PORT?: number | undefined;
}): {
  grpcHost: string;
  grpcPort: number;
  grpcHealthPort?: number;
} {
  return {
    grpcHost: e.GRPC_HOST,
    grpcPort: e.GRPC_PORT,
    ...(e.GRPC_HEALTH_PORT !== undefined ? { grpcHealthPort: e.GRPC_HEALTH_PORT } : {}),
  };
}

/**
 * The servers of a Redis or NATS URL, or of a comma-separated list of them, as a log line or a
 * message may show them: each one's host:port (with its scheme when `scheme` is set, with
 * `defaultPort` when it names none), never its user, password or token (which may hold an `@`,
 * `/` or `,`), nor its query (ioredis reads `?password=` too). A server that does not parse, or
 * whose `@` was not read as the end of its credentials, is shown as "?".
 */
export function shownServers(url: string, opts: { scheme?: boolean; defaultPort?: number } = {}): string {
  return url
    .split(",")
    .map((server) => server.trim())
    .filter(Boolean)
    .map((server) => {
      try {
        const hasScheme = server.includes("://");
        const u = new URL(hasScheme ? server : `tollgate://${server}`);
        if (u.hostname === "" || (server.includes("@") && !u.username && !u.password)) return "?";
        const host =
          u.port === "" && opts.defaultPort !== undefined ? `${u.host}:${opts.defaultPort}` : u.host;
        return opts.scheme && hasScheme ? `${u.protocol}//${host}` : host;
      } catch {
        return "?";
      }
    })
    .join(",");
}

/** `host:port,host:port`: the nodes of a Redis Cluster. */
export const REDIS_CLUSTER_NODES = /^\s*[^\s:/@,]+:\d+\s*(,\s*[^\s:/@,]+:\d+\s*)*$/;

/** REDIS_CLUSTER_NODES: a Redis Cluster's nodes; REDIS_URL then only gives credentials and TLS. */
export const redisClusterNodes = z.string().regex(REDIS_CLUSTER_NODES, "host:port,host:port").optional();

/** NATS_SERVERS: the servers of a NATS cluster, comma-separated; wins over NATS_URL (which may list them too). */
export const natsServers = z.string().optional();

/** NATS_STREAM_REPLICAS: replicas of the usage stream (3 on a three-node JetStream cluster); an existing stream with fewer is raised. */
export const streamReplicas = z.coerce.number().int().min(1).max(5).default(1);
