import { Cluster, type ClusterNode, type ScanStreamOptions, Redis as SingleRedis } from "ioredis";
import type { Logger } from "pino";
import { shownServers } from "./config.js";
import type { HealthCheck } from "./health.js";

/**
 * A Redis connection: one server (ioredis `Redis`) or a Redis Cluster (ioredis `Cluster`); both
 * have the same command API. On a cluster, every script and every pipeline or MULTI must keep
 * its keys in one hash slot (each store tags its keys so; see `clusterTag`).
 */
export type Redis = SingleRedis | Cluster;

export { REDIS_CLUSTER_NODES } from "./config.js";

/** The scheme of a cluster URL: `redis+cluster://[user:password@]h1:p1,h2:p2` (rediss+cluster: TLS). */
const CLUSTER_URL = /^(rediss?)\+cluster:\/\/(?:([^@/]*)@)?([^/?#]+)\/?$/;

/**
 * The one Redis URL a service connects to, from its REDIS_URL and REDIS_CLUSTER_NODES: with
 * cluster nodes (`h1:p1,h2:p2`), a `redis+cluster://` URL over them that keeps the credentials
 * (and TLS scheme) of REDIS_URL, if set; else REDIS_URL as it is. Undefined when neither is set.
 */
export function redisUrlOf(url: string | undefined, clusterNodes: string | undefined): string | undefined {
  const nodes = (clusterNodes ?? "")
    .split(",")
    .map((n) => n.trim())
    .filter(Boolean);
  if (nodes.length === 0) return url || undefined;
  for (const n of nodes)
    if (!/^[^\s:/@,]+:\d+$/.test(n)) throw new Error(`REDIS_CLUSTER_NODES: "${n}" is not host:port`);
  let scheme = "redis";
  let auth = "";
  if (url) {
    const cluster = CLUSTER_URL.exec(url);
    if (cluster) {
      scheme = cluster[1]!;
      auth = cluster[2] ? `${cluster[2]}@` : "";
    } else {
      const u = new URL(url);
      scheme = u.protocol === "rediss:" ? "rediss" : "redis";
      auth = u.username || u.password ? `${u.username}${u.password ? `:${u.password}` : ""}@` : "";
    }
  }
  return `${scheme}+cluster://${auth}${nodes.join(",")}`;
}

/** The parts of a `redis+cluster://` URL; undefined for a single-server URL. */
export function parseClusterUrl(
  url: string,
): { nodes: ClusterNode[]; username?: string; password?: string; tls: boolean } | undefined {
  const m = CLUSTER_URL.exec(url);
  if (!m) return undefined;
  const nodes = m[3]!.split(",").map((n) => {
    const at = n.lastIndexOf(":");
    if (at <= 0) throw new Error("a redis+cluster:// URL lists host:port pairs");
    const port = Number(n.slice(at + 1));
    if (!Number.isInteger(port) || port <= 0 || port > 65_535)
      throw new Error("a redis+cluster:// URL lists host:port pairs");
    return { host: n.slice(0, at), port };
  });
  const [user, ...rest] = m[2] ? m[2].split(":") : [];
  const password = rest.length > 0 ? decodeURIComponent(rest.join(":")) : undefined;
  return {
    nodes,
    ...(user ? { username: decodeURIComponent(user) } : {}),
    ...(password ? { password } : {}),
    tls: m[1] === "rediss",
  };
}

/**
 * Where a Redis URL points, for a log line: `host:port` (each node of a cluster URL, comma-separated),
 * never its credentials.
 */
export function redisAddress(url: string): string {
  return shownServers(url, { defaultPort: 6379 });
}

/** Whether a connection is to a Redis Cluster. */
export function isCluster(redis: Redis): redis is Cluster {
  return redis instanceof Cluster;
}

/**
 * The hash tag a store puts in front of keys that are not already tagged by account or channel,
 * so that the keys one script or pipeline touches share a slot: `{<name>}:` on a cluster, ""
 * on one server (whose key names stay as they always were).
 */
export function clusterTag(redis: Redis, name: string): string {
  return isCluster(redis) ? `{${name}}:` : "";
}

/** The part of a key Redis Cluster hashes: the first non-empty `{…}`, else the whole key. */
export function hashTagOf(key: string): string {
  const open = key.indexOf("{");
  const close = open < 0 ? -1 : key.indexOf("}", open + 1);
  return close > open + 1 ? key.slice(open + 1, close) : key;
}

/** A pipeline of either client, and one command's answer in it. */
export type Pipeline = ReturnType<Redis["pipeline"]>;
export type PipelineReply = [Error | null, unknown];

/**
 * Sends one batch of commands, `add(pipeline, item)` for each item, and answers each item's reply
 * in item order: one pipeline on one server; on a cluster, which serves a pipeline from one slot
 * only, one pipeline per hash tag of `keyOf(item)`, all sent at once (still one round trip of
 * wall time). `add` must queue exactly one command per item.
 */
export async function pipelined<T>(
  redis: Redis,
  items: readonly T[],
  keyOf: (item: T) => string,
  add: (pipeline: Pipeline, item: T) => void,
): Promise<PipelineReply[]> {
  const groups = new Map<string, number[]>();
  items.forEach((item, i) => {
    const group = isCluster(redis) ? hashTagOf(keyOf(item)) : "";
    const indices = groups.get(group);
    if (indices) indices.push(i);
    else groups.set(group, [i]);
  });
  // Filled below; an Error (its stack) is made only for an item no reply came for.
  const out = new Array<PipelineReply | undefined>(items.length);
  await Promise.all(
    [...groups.values()].map(async (indices) => {
      const pipeline = redis.pipeline();
      for (const i of indices) add(pipeline, items[i]!);
      const replies = await pipeline.exec();
      if (!replies) throw new Error("redis pipeline aborted");
      indices.forEach((i, n) => {
        out[i] = replies[n] as PipelineReply | undefined;
      });
    }),
  );
  return Array.from(out, (r) => r ?? [new Error("no reply"), null]);
}

/**
 * Every key matching `options.match`, in batches: SCAN on one server, SCAN on every master of a
 * cluster (tests and maintenance; never on a request path).
 */
export async function* scanStream(redis: Redis, options: ScanStreamOptions): AsyncGenerator<string[]> {
  const nodes = isCluster(redis) ? redis.nodes("master") : [redis];
  for (const node of nodes) for await (const batch of node.scanStream(options)) yield batch as string[];
}

/** Reconnect delay: at most 500 ms apart. */
const retryStrategy = (times: number) => Math.min(50 * 2 ** times, 500);

/**
 * Connects to Redis by URL: `redis://` / `rediss://` for one server, `redis+cluster://h1:p1,…`
 * for a Redis Cluster (see redisUrlOf). Commands fail fast while Redis is unreachable, so a
 * request fails in milliseconds (503) instead of hanging until a reconnect: commands issued
 * before the first connection wait for it, but once connected a command sent while
 * disconnected is refused at once (no offline queue), and a command in flight when the
 * connection drops is rejected, never resent on the next connection (its effect is unknown;
 * resending a Lua script could apply it twice). On a cluster the same holds per node: a command
 * in flight to a master that dies is rejected, not resent to its promoted replica; commands the
 * cluster refused without running them (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) are retried, about
 * 1.6 s at most. Reconnects go on forever, at most 500 ms apart. `name` (the service) is the
 * connection's CLIENT SETNAME, so `CLIENT LIST` shows who is who.
 */
export function connectRedis(url: string, name?: string, log?: Pick<Logger, "warn" | "info">): Redis {
  return watchConnection(openRedis(url, name), log);
}

/**
 * Logs a connection's losses and returns (one warn when it is lost, one info when it is ready
 * again), instead of ioredis printing "Unhandled error event" and a stack to stderr at every
 * reconnect attempt, which it does when nobody listens for `error`. The error's message names
 * the address, never the URL's credentials.
 */
function watchConnection(redis: Redis, log: Pick<Logger, "warn" | "info"> | undefined): Redis {
  let lost = false;
  redis.on("error", (err: Error & { code?: string }) => {
    if (lost) return;
    lost = true;
    log?.warn({ code: err.code, reason: err.message }, "redis connection lost; reconnecting");
  });
  redis.on("ready", () => {
    if (!lost) return;
    lost = false;
    log?.info("redis connection ready again");
  });
  return redis;
}

function openRedis(url: string, name?: string): Redis {
  const cluster = parseClusterUrl(url);
  if (cluster) {
    const client = new Cluster(cluster.nodes, {
      redisOptions: {
        ...(name ? { connectionName: name } : {}),
        ...(cluster.username ? { username: cluster.username } : {}),
        ...(cluster.password ? { password: cluster.password } : {}),
        ...(cluster.tls ? { tls: {} } : {}),
        maxRetriesPerRequest: 0,
        autoResendUnfulfilledCommands: false,
        connectTimeout: 2_000,
      },
      enableOfflineQueue: true,
      clusterRetryStrategy: retryStrategy,
      // "Connection is closed" may mean the command ran on the lost master: never resend it.
      retryDelayOnFailover: 0,
      retryDelayOnClusterDown: 100,
      retryDelayOnTryAgain: 100,
      maxRedirections: 16,
      slotsRefreshTimeout: 1_000,
      slotsRefreshInterval: 5_000,
    });
    client.once("ready", () => {
      client.options.enableOfflineQueue = false;
    });
    return client;
  }
  const redis = new SingleRedis(url, {
    ...(name ? { connectionName: name } : {}),
    maxRetriesPerRequest: 0,
    enableOfflineQueue: true,
    autoResendUnfulfilledCommands: false,
    connectTimeout: 2_000,
    retryStrategy,
  });
  redis.once("ready", () => {
    redis.options.enableOfflineQueue = false;
  });
  return redis;
}

const UNAVAILABLE_MESSAGES = [
  "Stream isn't writeable",
  "Connection is closed",
  "Reached the max retries per request limit",
  "LOADING ",
  "connect ECONNREFUSED",
  "connect ETIMEDOUT",
  "read ECONNRESET",
  "write EPIPE",
  // A Redis Cluster failing over, resharding or unreachable.
  "CLUSTERDOWN ",
  "TRYAGAIN ",
  "MASTERDOWN ",
  "Too many Cluster redirections",
  "Cluster isn't ready",
  "Failed to refresh slots cache",
  "None of startup nodes is available",
  "connect EHOSTUNREACH",
];

/**
 * Redis answered without data it must hold (it restarted empty and is being filled again): the
 * answer is unknown, not "no", so the caller is told to retry, as when Redis is unreachable.
 */
export class RedisDataLostError extends Error {
  override readonly name = "RedisDataLostError";
}

/**
 * Whether an error means Redis could not be reached (down, restarting, loading its data) rather
 * than a command being wrong: the caller should answer "unavailable, retry" (gRPC UNAVAILABLE,
 * HTTP 503), and a consumer should not acknowledge what it could not apply.
 */
export function isRedisUnavailable(err: unknown): boolean {
  if (err instanceof RedisDataLostError) return true;
  if (!(err instanceof Error)) return false;
  return UNAVAILABLE_MESSAGES.some((m) => err.message.startsWith(m));
}

/** A readiness check that PINGs Redis. */
export function redisHealth(redis: Redis): HealthCheck {
  return { name: "redis", check: async () => void (await redis.ping()) };
}

/** Closes a Redis connection, waiting for pending replies. */
export async function quitRedis(redis: Redis): Promise<void> {
  if (redis.status === "end") return;
  await redis.quit().catch(() => redis.disconnect());
}
