import type { InternalAuth } from "@tollgate/kit/credentials";
import { type Client, createClient, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import { PaymentService } from "@tollgate/proto/payment";
import type { PaidCommitOutcome, PaidCommitter } from "../domain/ports.js";

/** How long one Commit may take before its event is delivered again. */
const COMMIT_TIMEOUT_MS = 5_000;

/** The holds mpp-payment says it will never charge (its Commit's error detail `hold`). */
const FINISHED: ReadonlySet<string> = new Set<PaidCommitOutcome>(["unknown", "released", "expired"]);

/**
 * Commits paid-door holds through mpp-payment's Commit over gRPC (a comma list of addresses
 * spreads calls over its replicas); the channel connects on first use, so metering may start
 * before mpp-payment. Commit is idempotent by reservation id: a hold api-edge (or an earlier
 * delivery) committed already answers its first figures and is charged nothing more. A refusal
 * naming the hold unknown, released or expired is that outcome; anything else (UNAVAILABLE, a
 * timeout, a store failure) rejects, and the event is delivered again.
 */
export function createGrpcPaidCommitter(
  address: string,
  internalAuth?: InternalAuth,
): PaidCommitter & { close(): void } {
  return createPaidCommitter(createClient(PaymentService, address, internalAuth));
}

/** The same committer over a client the caller already has (the all-in-one's in-process one). */
export function createPaidCommitter(
  payment: Client<MethodsOf<typeof PaymentService>>,
): PaidCommitter & { close(): void } {
  return {
    async commit(item) {
      try {
        await payment.commit(
          {
            reservationId: item.reservationId,
            channelId: item.channelId,
            // No challenge: metering never shows the receipt Commit answers.
            challengeId: "",
            actualCost: item.cost.toString(),
          },
          { timeoutMs: COMMIT_TIMEOUT_MS },
        );
        return "committed";
      } catch (err) {
        const hold = err instanceof RemoteError ? err.details["hold"] : undefined;
        if (hold !== undefined && FINISHED.has(hold)) return hold as PaidCommitOutcome;
        throw err;
      }
    },
    close: () => payment.$close(),
  };
}
