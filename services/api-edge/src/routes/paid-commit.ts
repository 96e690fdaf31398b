import { GrpcStatus, RemoteError, STORE_UNAVAILABLE } from "@tollgate/kit/grpc";
import { retrying } from "@tollgate/kit/retry";
import { type StopDeadline, withinDeadline } from "@tollgate/kit/shutdown";
import type { FastifyBaseLogger } from "fastify";

/** How long Commit and Release are retried on the request path when no replica or its Redis answered (ms). */
const SETTLE_RETRY_MS = 5_000;
/**
 * How long a Commit sent after the answer is retried (ms): nobody waits for it, so it may ride
 * out a longer mpp-payment or Redis outage, and it ends well inside the hold's lifetime
 * (MPP_RESERVATION_TTL_SECONDS, 300 s), so it never meets a lapsed hold.
 */
const AFTER_ANSWER_RETRY_MS = 60_000;

/**
 * Whether a payment call failed without any replica's answer (the replica that took it died, or
 * none is connected yet) or because mpp-payment's Redis is down or restarting (kit's bridge
 * answers UNAVAILABLE with code store_unavailable; a call whose reply the outage lost may have
 * run, and its retry answers the same figures). A domain refusal is never retried.
 */
const noReplicaAnswered = (err: unknown) =>
  err instanceof RemoteError &&
  err.status === GrpcStatus.UNAVAILABLE &&
  (err.code === undefined || err.code === STORE_UNAVAILABLE);

/**
 * Runs an idempotent payment call (Commit and Release are idempotent by reservation id; the
 * hold lives in Redis, not in the replica) again while no replica answered it.
 */
export function onAnyReplica<T>(call: () => Promise<T>, forMs = SETTLE_RETRY_MS): Promise<T> {
  return retrying(call, noReplicaAnswered, { delayMs: 50, maxDelayMs: 1_000, forMs });
}

/** A canonical decimal amount of base units. */
const AMOUNT = /^(0|[1-9][0-9]{0,29})$/;

/** The request's charge: the router's cost, never above the quote its hold was taken for. */
export function chargeOf(cost: string | undefined, quote: string): bigint {
  const c = AMOUNT.test(cost ?? "") ? BigInt(cost!) : 0n;
  const q = AMOUNT.test(quote) ? BigInt(quote) : 0n;
  return c < q ? c : q;
}

/**
 * The Payment-Receipt of an answered request (docs/paid-door.md, "One round trip"): the receipt
 * of its hold (VerifyResponse.reserved_receipt: the channel's committed spend, accepted
 * cumulative and committed requests read with the hold) with the request's charge added to
 * `spent` and one to `units`, stamped `at`. Once the hold is committed the channel's spend is at
 * least that, and it stays within the accepted cumulative (spent + the hold never exceeds it, and
 * the charge is at most the hold). Undefined when the receipt is not one mpp-payment writes.
 */
export function receiptWithCharge(reserved: string, charge: bigint, at: Date): string | undefined {
  let receipt: unknown;
  try {
    receipt = JSON.parse(Buffer.from(reserved, "base64url").toString("utf8"));
  } catch {
    return undefined;
  }
  if (typeof receipt !== "object" || receipt === null) return undefined;
  const r = receipt as Record<string, unknown>;
  if (typeof r["spent"] !== "string" || !AMOUNT.test(r["spent"])) return undefined;
  if (r["units"] !== undefined && typeof r["units"] !== "number") return undefined;
  const answered = {
    ...r,
    timestamp: at.toISOString(),
    spent: (BigInt(r["spent"]) + charge).toString(),
    units: ((r["units"] as number | undefined) ?? 0) + 1,
  };
  return Buffer.from(JSON.stringify(answered)).toString("base64url");
}

/**
 * The longest api-edge's stop waits for Commits sent after their answer (ms), and never past the
 * stop's deadline (what the bound, SHUTDOWN_TIMEOUT_SECONDS, leaves once the requests in flight
 * are done): a Commit retrying against an mpp-payment that is stopping too (a whole release torn
 * down at once) does not hold the process until that bound exits it with 1. Such a Commit is left
 * to metering's, from the same request's usage event (docs/money.md, "Paid door: the commit
 * after the answer").
 */
const SHUTDOWN_COMMIT_WAIT_MS = 10_000;

/**
 * The Commits one api-edge sent after their answers and that have not finished yet, each with
 * what names it in a log.
 */
export class PaidCommits {
  readonly #pending = new Map<Promise<void>, { log: FastifyBaseLogger; reservationId: string }>();

  /**
   * Sends an answered request's Commit off the request path: started as soon as the answer is
   * written (the next turn of the event loop, so that none of its work, in process or on the
   * wire, comes before the answer's bytes), retried on another replica for up to a minute,
   * awaited by nobody but `settled`. A Commit that still fails is logged; metering's Commit from
   * the usage event charges the hold, or it lapses uncharged after its TTL (docs/money.md, "Paid
   * door: the commit after the answer").
   */
  send(commit: () => Promise<unknown>, log: FastifyBaseLogger, reservationId: string): void {
    const sent = new Promise<void>((r) => setImmediate(r))
      .then(() => onAnyReplica(commit, AFTER_ANSWER_RETRY_MS))
      .then(
        () => undefined,
        (err: unknown) => log.error({ err, reservationId }, "paid usage commit after the answer failed"),
      );
    this.#pending.set(sent, { log, reservationId });
    void sent.finally(() => this.#pending.delete(sent));
  }

  /**
   * Resolves once every Commit sent so far has finished, or after SHUTDOWN_COMMIT_WAIT_MS, or at
   * the stop's `deadline` if that comes first: api-edge's stop waits for it. A Commit still
   * retrying then is logged and left behind.
   */
  async settled(deadline?: StopDeadline): Promise<void> {
    if (this.#pending.size === 0) return;
    const withinMs = withinDeadline(SHUTDOWN_COMMIT_WAIT_MS, deadline);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((r) => {
      timer = setTimeout(() => r("late"), withinMs);
    });
    const outcome = await Promise.race([Promise.all([...this.#pending.keys()]), late]);
    clearTimeout(timer);
    if (outcome !== "late") return;
    for (const { log, reservationId } of this.#pending.values()) {
      log.warn(
        { reservationId, waitedMs: withinMs },
        "paid usage commit after the answer still retrying at shutdown: left to metering's commit",
      );
    }
  }
}
