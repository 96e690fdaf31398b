import type { GatewayConfig } from "@tollgate/config";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { InProcessService } from "@tollgate/kit/in-process";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type Registry } from "@tollgate/kit/metrics";
import { connectNats, drainNats, type NatsConnection, natsHealth } from "@tollgate/kit/nats";
import {
  connectRedis,
  isRedisUnavailable,
  quitRedis,
  type Redis,
  redisAddress,
  redisHealth,
} from "@tollgate/kit/redis";
import { untilReachable } from "@tollgate/kit/retry";
import {
  dependencyWait,
  type RunningService,
  runningService,
  type ServiceServerOptions,
  type ServiceServers,
  serveService,
} from "@tollgate/kit/service";
import { stopInOrder } from "@tollgate/kit/shutdown";
import { AuthService } from "@tollgate/proto/auth";
import { natsNames } from "@tollgate/proto/subjects";
import { createCachedKeyStore, DEFAULT_KEY_CACHE_TTL_MS } from "./adapters/cached-key-store.js";
import { createMemoryKeyStore } from "./adapters/memory-key-store.js";
import { createMemoryLedger } from "./adapters/memory-ledger.js";
import { createNatsRevocationPublisher } from "./adapters/nats-revocation-publisher.js";
import { createRedisKeyStore } from "./adapters/redis-key-store.js";
import { createRedisLedger } from "./adapters/redis-ledger.js";
import { createAdmin } from "./domain/admin.js";
import { broadcastDueDeadlines, DeadlineBroadcastError } from "./domain/deadlines.js";
import { importConfig } from "./domain/import-config.js";
import type { OverHold, RevocationPublisher } from "./domain/ports.js";
import { authMetrics, countAuthCalls } from "./metrics.js";
import { type Reseeding, reseedWhenLost } from "./reseed.js";
import { authAccess } from "./transport/grpc/access.js";
import { authHandlers } from "./transport/grpc/handlers.js";
import { subscribeRevocations } from "./transport/nats/revocations.js";

export { createMemoryRevocationBus, type MemoryRevocationBus } from "./adapters/memory-revocation-bus.js";
export type { KeyRevocation, RevocationPublisher } from "./domain/ports.js";

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface AuthPolicyOptions extends ServiceServerOptions {
  gateway: GatewayConfig;
  /** Redis holding accounts, keys and rate-limit counters for every replica; memory when unset. */
  redisUrl?: string;
  /** Prefix of every Redis key. Default "tollgate:". */
  redisPrefix?: string;
  /** NATS for the KeyRevoked broadcast; unset (and no deps.revocations): nothing is broadcast. */
  natsUrl?: string;
  /** Namespace of the NATS subjects (tests); "" in deployments. */
  natsNamespace?: string;
  /** Grace window of a RotateKey that names none. Default 24 h. */
  rotationGraceSeconds?: number;
  /** How long a budget hold counts when no usage arrives. Default 600 s. */
  reservationTtlSeconds?: number;
  /** How long a reservation can still be settled (late usage). Default 7 days. */
  settlementWindowSeconds?: number;
  /** How often due key deadlines (rotation ends, expiries) are looked for. Default 250 ms. */
  deadlineSweepMs?: number;
  /**
   * With Redis: how long a replica reuses a key record and its policy (0: never). Default
   * 1 000 ms, which bounds a revocation whose broadcast was lost; a received one applies at once.
   */
  keyCacheTtlMs?: number;
}

/** Dependencies the caller already owns; the all-in-one process may pass its in-memory broadcaster. */
export interface AuthPolicyDeps {
  revocations?: RevocationPublisher;
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
}

/** A running auth-policy. */
export type AuthPolicy = RunningService<MethodsOf<typeof AuthService>>;

/**
 * Builds the adapters, loads the configured accounts, connections and keys into the store,
 * serves AuthService and grpc.health.v1, broadcasts key deadlines as they fall due, and returns
 * a handle to stop it.
 */
export async function start(
  opts: AuthPolicyOptions,
  log: Logger,
  deps: AuthPolicyDeps = {},
): Promise<AuthPolicy> {
  let redis: Redis | undefined;
  let nc: NatsConnection | undefined;
  let servers: ServiceServers | undefined;
  let timer: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> | undefined;
  let unsubscribe: (() => void) | undefined;
  let stopReseeding: Reseeding | undefined;

  // Stops what was started so far, in order; stop() and a start() that fails half-way share it.
  const teardown = () =>
    stopInOrder([
      () => servers?.grpc.stop(),
      () => clearInterval(timer),
      () => unsubscribe?.(),
      () => sweeping,
      () => stopReseeding?.(),
      () => nc && drainNats(nc),
      () => redis && quitRedis(redis),
      () => servers?.metrics?.stop(),
    ]);

  try {
    const registry = deps.metrics ?? createMetrics("auth-policy");
    // The budget code reports how holds end: metrics.reservation("settled") and ("expired").
    const metrics = authMetrics(registry);
    const prefix = opts.redisPrefix ?? "tollgate:";
    if (opts.redisUrl) redis = connectRedis(opts.redisUrl, "auth-policy", log);
    // Across replicas the key and policy reads are cached for a moment; one process reads memory.
    // A key lookup that finds the store emptied checks for lost data at once, reconnect or not.
    const keyStoreOptions = { prefix, onDataLost: () => stopReseeding?.check() };
    const cache =
      redis && (opts.keyCacheTtlMs ?? DEFAULT_KEY_CACHE_TTL_MS) > 0
        ? createCachedKeyStore(createRedisKeyStore(redis, keyStoreOptions), {
            ttlMs: opts.keyCacheTtlMs ?? DEFAULT_KEY_CACHE_TTL_MS,
          })
        : undefined;
    const store = cache ?? (redis ? createRedisKeyStore(redis, keyStoreOptions) : createMemoryKeyStore());
    const ledgerOptions = {
      ...(opts.reservationTtlSeconds !== undefined ? { holdMs: opts.reservationTtlSeconds * 1_000 } : {}),
      ...(opts.settlementWindowSeconds !== undefined
        ? { settlementWindowMs: opts.settlementWindowSeconds * 1_000 }
        : {}),
      onHoldsExpired: (count: number) => {
        for (let i = 0; i < count; i++) metrics.reservation("expired");
      },
      onHoldSettled: () => metrics.reservation("settled"),
      // A usage event naming more than was reserved for it (a forged event, or a bug upstream):
      // charged only what was reserved (docs/money.md, "Leases"), counted and logged.
      onOverHold: (over: OverHold) => {
        metrics.overHold.inc({ kind: over.kind });
        // Counters are doubles: an int64 cost far above 2^53 is counted approximately.
        metrics.overHoldBaseUnits.inc({ kind: over.kind }, Number(over.asked - over.charged));
        log.warn(
          {
            kind: over.kind,
            reservationId: over.reservationId,
            eventId: over.eventId,
            asked: over.asked.toString(),
            charged: over.charged.toString(),
          },
          "settlement above what was reserved for it; charged only that",
        );
      },
    };
    const ledger = redis
      ? createRedisLedger(redis, { prefix, ...ledgerOptions })
      : createMemoryLedger(ledgerOptions);
    const seed = async () => {
      for (const change of await importConfig(store, opts.gateway)) {
        log.warn(
          change,
          "the configuration file changed a budget's period: its spend counts from zero in the new period",
        );
      }
    };
    const wait = dependencyWait(opts, log);
    // A Redis not reachable yet is waited for (the first import is what needs it), not a failed start.
    if (redis && wait)
      await untilReachable(`redis at ${redisAddress(opts.redisUrl!)}`, seed, isRedisUnavailable, wait.log);
    else await seed();
    // A Redis that comes back empty (restarted without persistence) gets the configuration again.
    if (redis) stopReseeding = reseedWhenLost({ connection: redis, store, gateway: opts.gateway, seed, log });

    const keyRevoked = natsNames(opts.natsNamespace ?? "").keyRevoked;
    if (opts.natsUrl) nc = await connectNats(opts.natsUrl, "auth-policy", wait);
    let publisher = deps.revocations;
    if (!publisher && nc) publisher = createNatsRevocationPublisher(nc, keyRevoked);
    // Every replica drops a key from its cache when any replica broadcasts that it stopped working.
    if (cache && nc) unsubscribe = subscribeRevocations(nc, keyRevoked, (r) => cache.forget(r.keyHash));
    if (publisher) {
      const broadcaster = publisher;
      timer = setInterval(() => {
        sweeping ??= broadcastDueDeadlines(store, broadcaster)
          .then(
            (n) => void (n > 0 && log.info({ count: n }, "key deadlines broadcast")),
            (err: unknown) =>
              log.warn(
                { err },
                err instanceof DeadlineBroadcastError
                  ? "key deadline broadcast failed: the publish (NATS) failed; will retry"
                  : "key deadlines not swept: the store (Redis) failed; will retry",
              ),
          )
          .finally(() => {
            sweeping = undefined;
          });
      }, opts.deadlineSweepMs ?? 250);
      timer.unref();
    } else if (redis) {
      log.warn("NATS_URL is not set: key revocations are not broadcast to caches in front of auth-policy");
    }

    const admin = createAdmin({
      store,
      publisher: publisher ?? { publish: async () => {} },
      knownModels: new Set(opts.gateway.models.map((m) => m.id)),
      ledger,
      ...(opts.rotationGraceSeconds !== undefined ? { defaultGraceSeconds: opts.rotationGraceSeconds } : {}),
    });
    const inProcess: InProcessService<MethodsOf<typeof AuthService>> = {
      service: AuthService,
      handlers: countAuthCalls(
        authHandlers({
          store,
          ledger,
          admin,
          log,
          prices: new Map(opts.gateway.models.map((m) => [m.id, m.pricing])),
          reasoningModels: new Set(opts.gateway.models.filter((m) => m.reasoning).map((m) => m.id)),
          embeddingModels: new Set(
            opts.gateway.models.filter((m) => m.kind === "embedding").map((m) => m.id),
          ),
        }),
        metrics,
      ),
      access: authAccess,
      log,
    };
    servers = await serveService(opts, inProcess, {
      checks: [...(redis ? [redisHealth(redis)] : []), ...(nc ? [natsHealth(nc)] : [])],
      registry,
    });
    log.info(
      {
        port: servers.grpc.port,
        metricsPort: servers.metrics?.port,
        store: redis ? "redis" : "memory",
        broadcast: nc ? "nats" : publisher ? "injected" : "none",
      },
      "auth-policy serving",
    );
    return {
      ...runningService(servers, inProcess, teardown),
    };
  } catch (err) {
    await teardown().catch(() => {});
    throw err;
  }
}
