import { fromBinary } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { BusSubscription, EventBus } from "@tollgate/kit/bus";
import type { Logger } from "@tollgate/kit/log";
import type { NatsNames } from "@tollgate/proto/subjects";
import { Door, type UsageRecorded, UsageRecordedSchema } from "@tollgate/proto/usage";
import { applyUsage } from "../../domain/apply-usage.js";
import type { ReservationSettler, UsageStore } from "../../domain/ports.js";
import { parseCost, type UsageEvent, validateUsageEvent } from "../../domain/usage.js";

/** Maps a UsageRecorded message to the domain event; throws MeteringError when it cannot be applied. */
export function toUsageEvent(m: UsageRecorded): UsageEvent {
  return validateUsageEvent({
    eventId: m.eventId,
    requestId: m.requestId,
    occurredAt: m.occurredAt ? timestampDate(m.occurredAt) : new Date(Number.NaN),
    accountId: m.accountId,
    connectionId: m.connectionId,
    keyId: m.keyId,
    model: m.model,
    inputTokens: m.inputTokens,
    outputTokens: m.outputTokens,
    reasoningTokens: m.reasoningTokens,
    cost: parseCost(m.cost),
    // Only account-door reservations are auth-policy's; the paid door settles with mpp-payment.
    ...(m.door === Door.ACCOUNT && m.reservationId !== "" ? { reservationId: m.reservationId } : {}),
  });
}

/** Told what became of each consumed event (for metrics); `message` is absent when it was invalid. */
export type UsageObserver = (outcome: "recorded" | "duplicate" | "invalid", message?: UsageRecorded) => void;

/**
 * Applies UsageRecorded events from the durable metering consumer. The handler resolves only
 * after the store has applied the event and, for an account-door event with a reservation, the
 * settler has settled it (the bus acks then); a failure of either rejects, so the bus delivers
 * again, and the store's dedupe and the idempotent settlement keep the count exact.
 */
export function consumeUsage(
  bus: EventBus,
  names: NatsNames,
  store: UsageStore,
  log: Logger,
  observe?: UsageObserver,
  settler?: ReservationSettler,
): Promise<BusSubscription> {
  return bus.subscribe(names.meteringDurable, names.usageRecorded, async (msg) => {
    let message: UsageRecorded;
    let event: UsageEvent;
    try {
      message = fromBinary(UsageRecordedSchema, msg.data);
      event = toUsageEvent(message);
    } catch (err) {
      // Redelivery cannot repair a malformed event; dropping it keeps the consumer moving.
      log.error({ err, msgId: msg.msgId, deliveryCount: msg.deliveryCount }, "invalid usage event dropped");
      observe?.("invalid");
      return;
    }
    const { outcome, settlement } = await applyUsage(event, store, settler);
    observe?.(outcome, message);
    log.debug(
      { requestId: event.requestId, model: event.model },
      outcome === "recorded" ? "usage recorded" : "duplicate usage event skipped",
    );
    if (settlement === "unknown") {
      // Not a reservation auth-policy knows (or older than its settlement window): nothing to do.
      // The reservation id names the account; the request id is enough to correlate.
      log.warn({ requestId: event.requestId }, "reservation unknown to auth-policy");
    } else if (settlement) {
      log.debug({ requestId: event.requestId, settlement }, "reservation settled");
    }
  });
}
