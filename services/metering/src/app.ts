import { type BusSubscription, createJetStreamBus, type EventBus } from "@tollgate/kit/bus";
import type { Client, MethodsOf } from "@tollgate/kit/grpc";
import type { InProcessService } from "@tollgate/kit/in-process";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type Registry } from "@tollgate/kit/metrics";
import { connectNats, drainNats, type NatsConnection, natsHealth } from "@tollgate/kit/nats";
import { connectRedis, quitRedis, type Redis, redisHealth } from "@tollgate/kit/redis";
import {
  dependencyWait,
  type RunningService,
  runningService,
  type ServiceServerOptions,
  type ServiceServers,
  serveService,
} from "@tollgate/kit/service";
import { stopInOrder } from "@tollgate/kit/shutdown";
import type { AuthService } from "@tollgate/proto/auth";
import { encodeMessage } from "@tollgate/proto/codec";
import { MeteringService } from "@tollgate/proto/metering";
import type { PaymentService } from "@tollgate/proto/payment";
import { natsNames } from "@tollgate/proto/subjects";
import { UsageRecordedSchema } from "@tollgate/proto/usage";
import { createGrpcPaidCommitter, createPaidCommitter } from "./adapters/grpc-paid-committer.js";
import {
  createGrpcReservationSettler,
  createReservationSettler,
} from "./adapters/grpc-reservation-settler.js";
import { createMemoryUsageStore } from "./adapters/memory-usage-store.js";
import { createRedisUsageStore } from "./adapters/redis-usage-store.js";
import { meteringMetrics } from "./metrics.js";
import { consumeUsage } from "./transport/bus/usage-consumer.js";
import { meteringAccess } from "./transport/grpc/access.js";
import { meteringHandlers } from "./transport/grpc/handlers.js";

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface MeteringOptions extends ServiceServerOptions {
  /** JetStream carrying usage events; required unless a bus is passed in. */
  natsUrl?: string;
  /** Namespace of the NATS stream, subjects and durable (tests); "" in deployments. */
  natsNamespace?: string;
  /** Replicas of the usage stream on a NATS cluster (created so, or raised to it). Default 1. */
  natsStreamReplicas?: number;
  /** Redis holding the rollups; the in-memory store when unset. */
  redisUrl?: string;
  /** Prefix of every Redis key. Default "tollgate:". */
  redisPrefix?: string;
  /**
   * auth-policy, which settles account-door budget reservations (SettleReservations); connected
   * on first use. Unset: reservations are not settled (they expire), which only suits tests.
   */
  authPolicyAddr?: string;
  /**
   * mpp-payment (a comma list spreads calls over its replicas), which commits the paid door's
   * holds from their usage events besides api-edge's Commit; connected on first use. Unset: paid
   * holds are committed by api-edge alone (docs/money.md, "Paid door: the commit after the answer").
   */
  mppPaymentAddr?: string;
  /** Most usage events applied together (one Redis round trip, one SettleReservations). Default 256. */
  batchMaxEvents?: number;
  /**
   * How long a batch waits for more usage events once one is in hand, in ms. Default 100: usage
   * is off the request path, and a tenth of a second of analytics lag buys fewer, larger batches.
   */
  batchLingerMs?: number;
}

const DEFAULT_BATCH_MAX_EVENTS = 256;
const DEFAULT_BATCH_LINGER_MS = 100;

/** Dependencies the caller already owns; the all-in-one process passes its in-memory bus. */
export interface MeteringDeps {
  bus?: EventBus;
  /**
   * auth-policy's client, when the caller already has one (the all-in-one calls it in process);
   * it replaces the gRPC client authPolicyAddr would dial.
   */
  authPolicy?: Client<MethodsOf<typeof AuthService>>;
  /** mpp-payment's client, likewise (the all-in-one's in-process one); replaces mppPaymentAddr. */
  mppPayment?: Client<MethodsOf<typeof PaymentService>>;
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
}

/** A running metering service. */
export interface Metering extends RunningService<MethodsOf<typeof MeteringService>> {
  /** Usage events published but not yet applied (consumer lag). */
  pending(): Promise<number>;
}

/** Connects the bus and the store, consumes UsageRecorded, serves MeteringService and grpc.health.v1. */
export async function start(opts: MeteringOptions, log: Logger, deps: MeteringDeps = {}): Promise<Metering> {
  const names = natsNames(opts.natsNamespace ?? "");
  if (!deps.bus && !opts.natsUrl) {
    throw new Error("metering needs an event bus: set NATS_URL (natsUrl) or pass deps.bus");
  }
  let nc: NatsConnection | undefined;
  let redis: Redis | undefined;
  let servers: ServiceServers | undefined;
  let subscription: BusSubscription | undefined;
  const settler = deps.authPolicy
    ? createReservationSettler(deps.authPolicy)
    : opts.authPolicyAddr
      ? createGrpcReservationSettler(opts.authPolicyAddr, opts.internalAuth)
      : undefined;
  const committer = deps.mppPayment
    ? createPaidCommitter(deps.mppPayment)
    : opts.mppPaymentAddr
      ? createGrpcPaidCommitter(opts.mppPaymentAddr, opts.internalAuth)
      : undefined;

  // Stops what was started so far, in order; stop() and a start() that fails half-way share it.
  const teardown = () =>
    stopInOrder([
      () => servers?.grpc.stop(),
      () => subscription?.stop(),
      () => settler?.close(),
      () => committer?.close(),
      () => nc && drainNats(nc),
      () => redis && quitRedis(redis),
      () => servers?.metrics?.stop(),
    ]);

  try {
    let bus = deps.bus;
    if (!bus) {
      nc = await connectNats(opts.natsUrl!, "metering", dependencyWait(opts, log));
      bus = await createJetStreamBus(nc, {
        name: names.usageStream,
        subjects: [names.usageSubjects],
        storage: "file",
        replicas: opts.natsStreamReplicas ?? 1,
      });
    }
    if (opts.redisUrl) redis = connectRedis(opts.redisUrl, "metering", log);
    const store = redis
      ? createRedisUsageStore(redis, { prefix: opts.redisPrefix ?? "tollgate:" })
      : createMemoryUsageStore();
    const registry = deps.metrics ?? createMetrics("metering");
    const metrics = meteringMetrics(registry, async () => (subscription ? subscription.pending() : 0));
    if (!settler) log.warn("AUTH_POLICY_ADDR is not set: budget reservations are not settled");
    if (!committer) {
      log.info(
        "MPP_PAYMENT_ADDR is off: paid-door holds are committed by api-edge alone, not from usage events",
      );
    }
    const charging = { settler, committer, observePaidCommit: metrics.observePaidCommit };
    subscription = await consumeUsage(bus, names, store, log, metrics.observe, charging, {
      maxEvents: opts.batchMaxEvents ?? DEFAULT_BATCH_MAX_EVENTS,
      lingerMs: opts.batchLingerMs ?? DEFAULT_BATCH_LINGER_MS,
    });
    const inProcess: InProcessService<MethodsOf<typeof MeteringService>> = {
      service: MeteringService,
      handlers: meteringHandlers(store, undefined, (usage) =>
        // Published like the router's own event: a second one under the same id is not stored.
        bus.publish(names.usageRecorded, encodeMessage(UsageRecordedSchema, usage), usage.eventId),
      ),
      access: meteringAccess,
      log,
    };
    servers = await serveService(opts, inProcess, {
      checks: [...(redis ? [redisHealth(redis)] : []), ...(nc ? [natsHealth(nc)] : [])],
      registry,
    });
    log.info(
      { port: servers.grpc.port, store: redis ? "redis" : "memory", metricsPort: servers.metrics?.port },
      "metering serving",
    );
    const consumer = subscription;
    return {
      ...runningService(servers, inProcess, teardown),
      pending: () => consumer.pending(),
    };
  } catch (err) {
    await teardown().catch(() => {});
    throw err;
  }
}
