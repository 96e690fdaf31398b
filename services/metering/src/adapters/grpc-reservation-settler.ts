import type { InternalAuth } from "@tollgate/kit/credentials";
import { createClient } from "@tollgate/kit/grpc";
import { AuthService, SettleOutcome } from "@tollgate/proto/auth";
import type { ReservationSettler, SettlementOutcome } from "../domain/ports.js";

/** How long one SettleReservation may take before the event is retried. */
const SETTLE_TIMEOUT_MS = 5_000;

const OUTCOMES: Partial<Record<SettleOutcome, SettlementOutcome>> = {
  [SettleOutcome.SETTLED]: "settled",
  [SettleOutcome.SETTLED_AFTER_EXPIRY]: "settled_after_expiry",
  [SettleOutcome.ALREADY_SETTLED]: "already_settled",
  [SettleOutcome.UNKNOWN_RESERVATION]: "unknown",
};

/**
 * Settles reservations through auth-policy's SettleReservation over gRPC. The channel connects
 * on first use, so metering may start before auth-policy; an unreachable auth-policy rejects.
 */
export function createGrpcReservationSettler(
  address: string,
  internalAuth?: InternalAuth,
): ReservationSettler & { close(): void } {
  const auth = createClient(AuthService, address, internalAuth);
  return {
    async settle(reservationId, cost, eventId) {
      const res = await auth.settleReservation(
        { reservationId, actualCost: cost.toString(), eventId },
        { timeoutMs: SETTLE_TIMEOUT_MS },
      );
      const outcome = OUTCOMES[res.outcome];
      if (!outcome) throw new Error(`SettleReservation answered outcome ${res.outcome}`);
      return outcome;
    },
    close: () => auth.$close(),
  };
}
