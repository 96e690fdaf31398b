import type { Handlers } from "@tollgate/kit/grpc";
import {
  Counter,
  countUnaryCalls,
  Histogram,
  METRIC_PREFIX,
  type Registry,
  SLOW_SECONDS_BUCKETS,
} from "@tollgate/kit/metrics";
import type { PaymentService } from "@tollgate/proto/payment";
import type { Chain } from "./domain/ports.js";

/** The PaymentService operations, each counted even before its first call. */
const OPERATIONS = ["challenge", "verify", "reserve", "commit", "release", "close"] as const;

/** Chain adapter calls that reach the JSON-RPC endpoint (the check* methods are local decoding). */
const CHAIN_CALLS = ["submitOpen", "submitTopUp", "state", "settle", "close"] as const;

/**
 * mpp-payment's Prometheus instruments (docs/operations.md, "Metrics"). Labels are operation names and error
 * codes only: never credentials, channel ids, payer addresses or receipts.
 */
export interface PaymentMetrics {
  operations: Counter<"op" | "outcome">;
  chainRpc: Histogram<"method">;
  /** Commits whose cost was above the hold, and the base units not charged for it. */
  overHold: { commits: Counter; baseUnits: Counter };
}

/** Registers mpp-payment's metrics on `registry`. */
export function paymentMetrics(registry: Registry): PaymentMetrics {
  const operations = new Counter({
    name: `${METRIC_PREFIX}payment_operations_total`,
    help: "PaymentService calls by operation and outcome (ok or the mpp error code)",
    labelNames: ["op", "outcome"],
    registers: [registry],
  });
  for (const op of OPERATIONS) operations.inc({ op, outcome: "ok" }, 0);
  const chainRpc = new Histogram({
    name: `${METRIC_PREFIX}chain_rpc_duration_seconds`,
    help: "Time spent in Tempo chain calls by adapter method (broadcast and wait included), failures too",
    labelNames: ["method"],
    buckets: [...SLOW_SECONDS_BUCKETS],
    registers: [registry],
  });
  // A rising count is a misbehaving or forged usage event: a request is never charged above its
  // hold (docs/kubernetes.md, "NATS and Redis are trust boundaries").
  const overHold = {
    commits: new Counter({
      name: `${METRIC_PREFIX}payment_commits_over_hold_total`,
      help: "Commits whose actual cost was above the request's hold; the hold was charged",
      registers: [registry],
    }),
    baseUnits: new Counter({
      name: `${METRIC_PREFIX}payment_commits_over_hold_base_units_total`,
      help: "Base units named above the hold by commits and not charged",
      registers: [registry],
    }),
  };
  return { operations, chainRpc, overHold };
}

/** Counts a commit above its hold (PaymentsDeps.onOverHold). */
export function countOverHold(m: PaymentMetrics) {
  return ({ actual, charged }: { actual: bigint; charged: bigint }): void => {
    m.overHold.commits.inc();
    m.overHold.baseUnits.inc(Number(actual - charged));
  };
}

/**
 * Counts every PaymentService call by operation and outcome. A Verify that also took the hold
 * (reserve_request_id) counts as a reserve as well; a hold it could not take is its outcome.
 */
export function countPaymentCalls(
  handlers: Handlers<typeof PaymentService>,
  m: PaymentMetrics,
): Handlers<typeof PaymentService> {
  return countUnaryCalls(handlers, (op, outcome, _req, res) => {
    m.operations.inc({ op, outcome });
    const reserved = op === "verify" && (res as { reservationId?: string } | undefined)?.reservationId;
    if (reserved) m.operations.inc({ op: "reserve", outcome: "ok" });
  });
}

/** Times each chain call that goes over JSON-RPC. */
export function instrumentChain(chain: Chain, m: PaymentMetrics): Chain {
  // Everything else (canSend, the local check* methods) is the chain's own, through the prototype.
  const timed = Object.create(chain) as Record<string, unknown>;
  for (const method of CHAIN_CALLS) {
    const original = chain[method] as (...args: unknown[]) => Promise<unknown>;
    timed[method] = async (...args: unknown[]) => {
      const end = m.chainRpc.startTimer({ method });
      try {
        return await original.apply(chain, args);
      } finally {
        end();
      }
    };
  }
  return timed as unknown as Chain;
}
