import { jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import { connect, type NatsConnection, type NodeConnectionOptions, nanos } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { shownServers } from "./config.js";
import type { HealthCheck } from "./health.js";
import { untilReachable } from "./retry.js";

export type { NatsConnection } from "@nats-io/transport-node";

/** The servers of a comma-separated list (`nats://a:4222,nats://b:4222`), blanks dropped. */
export function natsServers(list: string): string[] {
  return list
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
}

/**
 * The NATS server list a service connects to, from its NATS_SERVERS and NATS_URL (either may
 * list several servers, comma-separated; NATS_SERVERS wins when both are set). Undefined when
 * neither is set.
 */
export function natsUrlOf(url: string | undefined, servers: string | undefined): string | undefined {
  const list = natsServers(servers || url || "");
  return list.length > 0 ? list.join(",") : undefined;
}

/**
 * The credentials a NATS URL carries (`nats://user:password@host:4222`, or `nats://token@host`),
 * percent-decoded, from the first server of the list that has any; nats.js itself does not read
 * them from a URL. Undefined when none does.
 */
export function natsCredentials(
  servers: readonly string[],
): { user: string; pass: string } | { token: string } | undefined {
  for (const server of servers) {
    if (!server.includes("@")) continue;
    let u: URL;
    try {
      u = new URL(server.includes("://") ? server : `nats://${server}`);
    } catch {
      continue;
    }
    if (u.username === "" && u.password === "") continue;
    const user = decodeURIComponent(u.username);
    if (u.password === "") return { token: user };
    return { user, pass: decodeURIComponent(u.password) };
  }
  return undefined;
}

/** A server of the list without the credentials it may carry (they go in the options). */
function withoutCredentials(server: string): string {
  return server.replace(/^([a-z]+:\/\/)?[^@/]*@/i, (_m, scheme: string | undefined) => scheme ?? "");
}

/**
 * The options of every NATS connection the services make, given one server or a comma-separated
 * list of the servers of a cluster (the client also learns the others from the cluster):
 * reconnect forever, to any of them, so a restart of a server is survived, and no async stack
 * trace captured per request and publish (nats.js builds an Error for each one otherwise; a
 * failed call still carries its own stack). A user and password, or a token, in the URL
 * authenticate the connection: NATS is a trust boundary (docs/kubernetes.md, "NATS and Redis
 * are trust boundaries").
 */
export function natsOptions(url: string, name: string): NodeConnectionOptions {
  const servers = natsServers(url);
  return {
    servers: servers.map(withoutCredentials),
    ...natsCredentials(servers),
    name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    noAsyncTraces: true,
  };
}

/** Where a server list points, for a log line: `host:port` of each server, no scheme, no credentials. */
export function natsAddress(url: string): string {
  return shownServers(url);
}

/** nats.js could not reach any server of the list (refused, unresolvable, timed out). */
function isNatsUnreachable(err: unknown): boolean {
  return err instanceof Error && (err.name === "ConnectionError" || err.name === "TimeoutError");
}

/**
 * Connects to NATS with {@link natsOptions}. With `wait` (a service at start), a NATS that cannot
 * be reached yet is waited for, one warn per try (kit/retry.ts, untilReachable), rather than failing
 * the start; without it the first failure rejects (the all-in-one, which explains it and exits).
 */
export function connectNats(
  url: string,
  name: string,
  wait?: { log: Pick<Logger, "warn"> },
): Promise<NatsConnection> {
  const options = natsOptions(url, name);
  if (!wait) return connect(options);
  return untilReachable(`nats at ${natsAddress(url)}`, () => connect(options), isNatsUnreachable, wait.log);
}

/** A readiness check that reports NATS as connected. */
export function natsHealth(nc: NatsConnection): HealthCheck {
  return {
    name: "nats",
    check: async () => {
      if (nc.isClosed()) throw new Error("closed");
      await nc.flush();
    },
  };
}

/** The JetStream stream options of a stream the project owns. */
export interface StreamSpec {
  name: string;
  subjects: string[];
  /** File storage survives a NATS restart; memory is for throwaway test streams. */
  storage?: "file" | "memory";
  replicas?: number;
  /** Publishes with the same message id inside this window are stored once. */
  duplicateWindowMs?: number;
}

/**
 * Creates the stream if it is missing, with `spec.replicas` (default 1); raises the replica
 * count of an existing stream that has fewer (never lowers it: an operator may have set more).
 * Safe to call from every replica.
 */
export async function ensureStream(nc: NatsConnection, spec: StreamSpec): Promise<void> {
  const jsm = await jetstreamManager(nc);
  const config = {
    name: spec.name,
    subjects: spec.subjects,
    storage: spec.storage === "memory" ? StorageType.Memory : StorageType.File,
    retention: RetentionPolicy.Limits,
    num_replicas: spec.replicas ?? 1,
    duplicate_window: nanos(spec.duplicateWindowMs ?? 120_000),
  };
  let existing: Awaited<ReturnType<typeof jsm.streams.info>>;
  try {
    existing = await jsm.streams.info(spec.name);
  } catch {
    try {
      await jsm.streams.add(config);
      return;
    } catch (err) {
      // Another replica may have created it between the lookup and the add.
      existing = await jsm.streams.info(spec.name).catch(() => {
        throw err;
      });
    }
  }
  if (existing.config.num_replicas < config.num_replicas)
    await jsm.streams.update(spec.name, { num_replicas: config.num_replicas });
}

/** Drains a NATS connection: pending publishes and subscriptions finish, then it closes. */
export async function drainNats(nc: NatsConnection): Promise<void> {
  if (nc.isClosed()) return;
  await nc.drain().catch(() => nc.close());
}
