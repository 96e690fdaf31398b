import { hostname } from "node:os";
import type { GatewayConfig } from "@tollgate/config";
import { ConfigError } from "@tollgate/kit/config";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { InProcessService } from "@tollgate/kit/in-process";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type Registry } from "@tollgate/kit/metrics";
import { connectRedis, quitRedis, type Redis, redisHealth } from "@tollgate/kit/redis";
import {
  type RunningService,
  runningService,
  type ServiceServerOptions,
  type ServiceServers,
  serveService,
} from "@tollgate/kit/service";
import { type StopDeadline, stopInOrder } from "@tollgate/kit/shutdown";
import { PaymentService } from "@tollgate/proto/payment";
import type { Address, Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { createMemoryChannelStore } from "./adapters/memory-channel-store.js";
import { createRedisChannelStore } from "./adapters/redis-channel-store.js";
import { createTempoRpcChain } from "./adapters/tempo-rpc-chain.js";
import { DEFAULTS } from "./defaults.js";
import { MAX_AMOUNT } from "./domain/amounts.js";
import { createCatalog } from "./domain/catalog.js";
import { createPayments } from "./domain/payments.js";
import type { Chain } from "./domain/ports.js";
import type { PaymentSettings } from "./domain/settings.js";
import { createSettlementWorker, type SettlementWorker } from "./domain/settlement.js";
import { countOverHold, countPaymentCalls, instrumentChain, paymentMetrics } from "./metrics.js";
import { paymentAccess } from "./transport/grpc/access.js";
import { paymentHandlers } from "./transport/grpc/handlers.js";

export { DEFAULTS };

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface MppPaymentOptions extends ServiceServerOptions {
  /** Plans, models and prices (TOLLGATE_CONFIG); it must define plans. */
  gateway: GatewayConfig;
  /** Redis holding channel state; the in-memory store when unset (the all-in-one process). */
  redisUrl?: string;
  /** Prefix of every Redis key. Default "tollgate:". */
  redisPrefix?: string;
  /** HMAC key of challenge ids, at least 32 bytes, the same on every replica. */
  secret: string;
  /** Challenge realm. Default "tollgate". */
  realm?: string;
  /** Tempo JSON-RPC endpoint (mainnet, or the devnet). */
  tempoRpcUrl: string;
  /** Default 4217 (Tempo mainnet). */
  chainId?: number;
  /** Session currency. Default USDC.e. */
  currency?: Address;
  /** Session escrow. Default the TIP-1034 precompile 0x4d505…. */
  escrow?: Address;
  /** 0x-prefixed private key of the payee, which signs settle and close; without it Close answers mpp_session_close_unavailable. */
  payeeKey?: Hex;
  /** Payee address; defaults to the payee key's address. One of the two is required. */
  recipient?: Address;
  /** Challenge amount, base units. Default 1000000. */
  voucherBucket?: bigint;
  /** suggestedDeposit, base units. Default 5000000. */
  suggestedDeposit?: bigint;
  /** Default 300. */
  challengeTtlSeconds?: number;
  /** When set, only these payers may pay. */
  payerAllowlist?: readonly Address[];
  /** Default 8192. */
  maxCredentialBytes?: number;
  /** Seconds between settlement passes; 0 disables the worker. Default 60. */
  settleIntervalSeconds?: number;
  /** Lifetime of an uncommitted hold. Default 300. */
  reservationTtlSeconds?: number;
  /** How long one chain JSON-RPC request may take before it is abandoned (retried at most 3 times). Default 10000. */
  rpcTimeoutMs?: number;
  /** How often the chain adapter polls for receipts. Default 500 ms. */
  rpcPollingIntervalMs?: number;
}

/** Dependencies the caller already owns (tests pass a stand-in chain). */
export interface MppPaymentDeps {
  chain?: Chain;
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
}

/** A running mpp-payment. */
export interface MppPayment extends RunningService<MethodsOf<typeof PaymentService>> {
  /** Runs one settlement pass now (also when the interval is 0). */
  settleOnce(): Promise<void>;
}

/** Checks what zod in config.ts cannot see when start() is called directly; throws ConfigError naming every problem. */
function settingsOf(opts: MppPaymentOptions): PaymentSettings {
  const problems: string[] = [];
  if (Buffer.byteLength(opts.secret, "utf8") < 32) problems.push("secret: must be at least 32 bytes");
  let payee: Address | undefined;
  if (opts.payeeKey !== undefined) {
    if (/^0x[0-9a-fA-F]{64}$/.test(opts.payeeKey)) payee = privateKeyToAccount(opts.payeeKey).address;
    else problems.push("payeeKey: must be a 0x-prefixed 32-byte hex private key");
  }
  const recipient = opts.recipient ?? payee;
  if (!recipient) problems.push("recipient: required unless payeeKey is given");
  if (recipient && payee && recipient.toLowerCase() !== payee.toLowerCase()) {
    problems.push(
      "recipient: differs from the payee key's address; the escrow accepts settle and close only from the payee",
    );
  }
  const bucket = opts.voucherBucket ?? DEFAULTS.voucherBucket;
  if (bucket <= 0n || bucket > MAX_AMOUNT)
    problems.push("voucherBucket: must be a positive amount below 2^53");
  const suggestedDeposit = opts.suggestedDeposit ?? DEFAULTS.suggestedDeposit;
  if (suggestedDeposit <= 0n || suggestedDeposit > MAX_AMOUNT) {
    problems.push("suggestedDeposit: must be a positive amount below 2^53");
  }
  if (!opts.gateway.plans)
    problems.push("gateway: the configuration defines no plans (Starter, Plus, Premium)");
  if (problems.length > 0 || !recipient) throw new ConfigError(problems);
  return {
    realm: opts.realm ?? DEFAULTS.realm,
    secret: opts.secret,
    chainId: opts.chainId ?? DEFAULTS.chainId,
    currency: opts.currency ?? DEFAULTS.currency,
    escrow: opts.escrow ?? DEFAULTS.escrow,
    recipient,
    bucket,
    suggestedDeposit,
    challengeTtlSeconds: opts.challengeTtlSeconds ?? DEFAULTS.challengeTtlSeconds,
    ...(opts.payerAllowlist ? { payerAllowlist: opts.payerAllowlist } : {}),
    maxCredentialBytes: opts.maxCredentialBytes ?? DEFAULTS.maxCredentialBytes,
    reservationTtlSeconds: opts.reservationTtlSeconds ?? DEFAULTS.reservationTtlSeconds,
  };
}

/** Builds the store and the chain adapter, serves PaymentService and grpc.health.v1, runs the settlement worker. */
export async function start(
  opts: MppPaymentOptions,
  log: Logger,
  deps: MppPaymentDeps = {},
): Promise<MppPayment> {
  const settings = settingsOf(opts);
  const catalog = createCatalog(opts.gateway);
  const registry = deps.metrics ?? createMetrics("mpp-payment");
  const metrics = paymentMetrics(registry);
  const rawChain =
    deps.chain ??
    createTempoRpcChain({
      url: opts.tempoRpcUrl,
      chainId: settings.chainId,
      escrow: settings.escrow,
      currency: settings.currency,
      recipient: settings.recipient,
      ...(opts.payeeKey ? { payeeKey: opts.payeeKey } : {}),
      ...(opts.rpcPollingIntervalMs ? { pollingIntervalMs: opts.rpcPollingIntervalMs } : {}),
      rpcTimeoutMs: opts.rpcTimeoutMs ?? DEFAULTS.rpcTimeoutMs,
    });
  const chain = instrumentChain(rawChain, metrics);
  let redis: Redis | undefined;
  let servers: ServiceServers | undefined;
  let worker: SettlementWorker | undefined;

  // Stops what was started so far, in order; stop() and a start() that fails half-way share it.
  const teardown = (deadline?: StopDeadline) =>
    stopInOrder([
      () => servers?.grpc.stop(),
      () => worker?.stop(deadline?.remainingMs()),
      () => redis && quitRedis(redis),
      () => servers?.metrics?.stop(),
    ]);

  try {
    // Named per process, so CLIENT LIST tells which replica holds a connection (and a blocked call).
    if (opts.redisUrl) redis = connectRedis(opts.redisUrl, `mpp-payment:${hostname()}:${process.pid}`, log);
    const store = redis
      ? createRedisChannelStore(redis, { prefix: opts.redisPrefix ?? DEFAULTS.redisPrefix })
      : createMemoryChannelStore();
    const payments = createPayments({
      settings,
      catalog,
      store,
      chain,
      log,
      onOverHold: countOverHold(metrics),
    });
    const intervalSeconds = opts.settleIntervalSeconds ?? DEFAULTS.settleIntervalSeconds;
    worker = createSettlementWorker(
      { store, chain, log, lockTtlMs: Math.max(2 * intervalSeconds, 120) * 1000 },
      intervalSeconds * 1000,
    );
    const inProcess: InProcessService<MethodsOf<typeof PaymentService>> = {
      service: PaymentService,
      handlers: countPaymentCalls(paymentHandlers(payments), metrics),
      access: paymentAccess,
      log,
    };
    servers = await serveService(opts, inProcess, {
      checks: redis ? [redisHealth(redis)] : [],
      registry,
    });
    log.info(
      {
        port: servers.grpc.port,
        metricsPort: servers.metrics?.port,
        store: redis ? "redis" : "memory",
        chainId: settings.chainId,
        closeSigner: chain.canSend,
        settleIntervalSeconds: chain.canSend ? intervalSeconds : 0,
      },
      "mpp-payment serving",
    );
    const running = worker;
    return {
      ...runningService(servers, inProcess, teardown),
      settleOnce: () => running.runOnce(),
    };
  } catch (err) {
    await teardown().catch(() => {});
    throw err;
  }
}
