import { jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import { connect, type NatsConnection, type NodeConnectionOptions, nanos } from "@nats-io/transport-node";
import type { HealthCheck } from "./health.js";

export type { NatsConnection } from "@nats-io/transport-node";

/**
 * The options of every NATS connection the services make: reconnect forever so a restart of the
 * server is survived, and no async stack trace captured per request and publish (nats.js builds
 * an Error for each one otherwise; a failed call still carries its own stack).
 */
export function natsOptions(url: string, name: string): NodeConnectionOptions {
  return {
    servers: url.split(","),
    name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    noAsyncTraces: true,
  };
}

/** Connects to NATS with {@link natsOptions}. */
export function connectNats(url: string, name: string): Promise<NatsConnection> {
  return connect(natsOptions(url, name));
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

/** Creates the stream if it is missing, or updates its subjects; safe to call from every replica. */
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
  try {
    await jsm.streams.info(spec.name);
  } catch {
    try {
      await jsm.streams.add(config);
    } catch (err) {
      // Another replica may have created it between the lookup and the add.
      await jsm.streams.info(spec.name).catch(() => {
        throw err;
      });
    }
  }
}

/** Drains a NATS connection: pending publishes and subscriptions finish, then it closes. */
export async function drainNats(nc: NatsConnection): Promise<void> {
  if (nc.isClosed()) return;
  await nc.drain().catch(() => nc.close());
}
