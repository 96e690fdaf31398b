import type { InternalAuth } from "@tollgate/kit/credentials";
import { type Client, createClient, GrpcStatus, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import { AuthService, SettleOutcome } from "@tollgate/proto/auth";
import type { ReservationSettler, SettleItem, SettlementOutcome } from "../domain/ports.js";

/** How long one SettleReservations call may take before its events are retried. */
const SETTLE_TIMEOUT_MS = 5_000;

/** How long to settle one by one before asking for SettleReservations again. */
const RETRY_BATCH_AFTER_MS = 60_000;

const OUTCOMES: Partial<Record<SettleOutcome, SettlementOutcome>> = {
  [SettleOutcome.SETTLED]: "settled",
  [SettleOutcome.SETTLED_AFTER_EXPIRY]: "settled_after_expiry",
  [SettleOutcome.ALREADY_SETTLED]: "already_settled",
  [SettleOutcome.UNKNOWN_RESERVATION]: "unknown",
};

/** What auth-policy answered for one item, as the settler port says it. */
function outcomeOf(outcome: SettleOutcome, errorCode = ""): SettlementOutcome | Error {
  const known = OUTCOMES[outcome];
  if (known) return known;
  return new Error(errorCode ? `not settled: ${errorCode}` : `settlement answered outcome ${outcome}`);
}

/**
 * Settles reservations through auth-policy's SettleReservations over gRPC, one call per batch.
 * The channel connects on first use, so metering may start before auth-policy; an unreachable
 * auth-policy rejects. An auth-policy that predates SettleReservations (UNIMPLEMENTED, during a
 * rolling upgrade) is asked one SettleReservation per item instead, for a minute at a time.
 */
export function createGrpcReservationSettler(
  address: string,
  internalAuth?: InternalAuth,
): ReservationSettler & { close(): void } {
  return createReservationSettler(createClient(AuthService, address, internalAuth));
}

/** The same settler over a client the caller already has (the all-in-one's in-process one). */
export function createReservationSettler(
  auth: Client<MethodsOf<typeof AuthService>>,
): ReservationSettler & { close(): void } {
  // Until when to settle one by one after an UNIMPLEMENTED (ms since the epoch).
  let oneByOneUntil = 0;

  async function oneByOne(items: readonly SettleItem[]): Promise<Array<SettlementOutcome | Error>> {
    return Promise.all(
      items.map((i) =>
        auth
          .settleReservation(
            { reservationId: i.reservationId, actualCost: i.cost.toString(), eventId: i.eventId },
            { timeoutMs: SETTLE_TIMEOUT_MS },
          )
          .then(
            (res) => outcomeOf(res.outcome),
            (err: unknown) => (err instanceof Error ? err : new Error(String(err))),
          ),
      ),
    );
  }

  return {
    async settleMany(items) {
      if (items.length === 0) return [];
      if (Date.now() < oneByOneUntil) return oneByOne(items);
      let res: Awaited<ReturnType<typeof auth.settleReservations>>;
      try {
        res = await auth.settleReservations(
          {
            items: items.map((i) => ({
              reservationId: i.reservationId,
              actualCost: i.cost.toString(),
              eventId: i.eventId,
            })),
          },
          { timeoutMs: SETTLE_TIMEOUT_MS },
        );
      } catch (err) {
        if (err instanceof RemoteError && err.status === GrpcStatus.UNIMPLEMENTED) {
          oneByOneUntil = Date.now() + RETRY_BATCH_AFTER_MS;
          return oneByOne(items);
        }
        throw err;
      }
      if (res.results.length !== items.length) {
        throw new Error(
          `SettleReservations answered ${res.results.length} results for ${items.length} items`,
        );
      }
      return res.results.map((r) => outcomeOf(r.outcome, r.errorCode));
    },
    close: () => auth.$close(),
  };
}
