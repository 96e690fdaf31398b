import { fromBinary } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { BusSubscription, EventBus } from "@tollgate/kit/bus";
import type { Logger } from "@tollgate/kit/log";
import type { NatsNames } from "@tollgate/proto/subjects";
import { type UsageRecorded, UsageRecordedSchema } from "@tollgate/proto/usage";
import type { UsageStore } from "../../domain/ports.js";
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
  });
}

/**
 * Applies UsageRecorded events from the durable metering consumer. The handler resolves only
 * after the store has applied the event (the bus acks then); a store failure rejects, so the
 * bus delivers again and the store's dedupe keeps the count exact.
 */
export function consumeUsage(
  bus: EventBus,
  names: NatsNames,
  store: UsageStore,
  log: Logger,
): Promise<BusSubscription> {
  return bus.subscribe(names.meteringDurable, names.usageRecorded, async (msg) => {
    let event: UsageEvent;
    try {
      event = toUsageEvent(fromBinary(UsageRecordedSchema, msg.data));
    } catch (err) {
      // Redelivery cannot repair a malformed event; dropping it keeps the consumer moving.
      log.error({ err, msgId: msg.msgId, deliveryCount: msg.deliveryCount }, "invalid usage event dropped");
      return;
    }
    const outcome = await store.record(event);
    log.debug(
      { requestId: event.requestId, model: event.model },
      outcome === "recorded" ? "usage recorded" : "duplicate usage event skipped",
    );
  });
}
