import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { BatchVerdict, BusMessage, BusSubscription, EventBus } from "@tollgate/kit/bus";
import type { Logger } from "@tollgate/kit/log";
import type { NatsNames } from "@tollgate/proto/subjects";
import { Door, type UsageRecorded, usageEventsOf } from "@tollgate/proto/usage";
import { type Applied, applyUsageBatch, type Charging } from "../../domain/apply-usage.js";
import type { PaidCommitOutcome, UsageStore } from "../../domain/ports.js";
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
    // Only account-door reservations are auth-policy's; the paid door's holds are mpp-payment's,
    // committed with their channel (an event from a router older than channel_id has none:
    // api-edge's Commit alone charges it).
    ...(m.door === Door.ACCOUNT && m.reservationId !== "" ? { reservationId: m.reservationId } : {}),
    ...(m.door === Door.PAID && m.reservationId !== "" && m.channelId !== ""
      ? { paidHold: { reservationId: m.reservationId, channelId: m.channelId } }
      : {}),
  });
}

/** Told what became of each consumed event (for metrics); `message` is absent when it was invalid. */
export type UsageObserver = (outcome: "recorded" | "duplicate" | "invalid", message?: UsageRecorded) => void;

/** Where the consumer charges usage besides the rollups, and who is told of each paid commit (metrics). */
export interface UsageCharging extends Charging {
  observePaidCommit?: (outcome: PaidCommitOutcome) => void;
}

/** How the consumer batches; the bus defaults apply to what is left out. */
export interface UsageBatching {
  /** Most events applied together. Default 256. */
  maxEvents?: number;
  /** How long a batch waits for more events once one is in hand (ms). Default 0. */
  lingerMs?: number;
}

/**
 * Applies usage events from the metering durable consumers, a batch at a time: UsageRecorded
 * (one event a message) on one, UsageBatch (several, from a router under load) on the other, so
 * a metering replica older than batches never sees one (docs/architecture.md, "The bus"). Every
 * event the bus has in hand is recorded in one store round trip and every reservation among
 * them settled in one call (docs/architecture.md, "Metering in batches"); every paid hold among
 * them is committed with mpp-payment (docs/money.md, "Paid door: the commit after the answer").
 * A message is acknowledged only after the store has applied each of its events and, for an
 * account-door event with a reservation, the settler has settled it, and for a paid-door event
 * with a hold, mpp-payment has answered its commit (a hold it will never charge, being unknown,
 * released or expired, is logged and counted, not retried); one with an event whose recording,
 * settlement or commit failed is delivered again, and the store's dedupe by event id and the
 * idempotent settlement and commit keep the count exact for the events it carries that were
 * applied already. A malformed message or event is dropped (redelivery cannot repair it)
 * without holding up the rest.
 */
export async function consumeUsage(
  bus: EventBus,
  names: NatsNames,
  store: UsageStore,
  log: Logger,
  observe?: UsageObserver,
  charging: UsageCharging = {},
  batching: UsageBatching = {},
): Promise<BusSubscription> {
  const handle = async (msgs: BusMessage[]): Promise<BatchVerdict[]> => {
    // A message none of whose events is valid is dropped; one with a valid event is acked or retried.
    const verdicts: BatchVerdict[] = msgs.map(() => "drop");
    const valid: Array<{ at: number; message: UsageRecorded; event: UsageEvent }> = [];
    msgs.forEach((msg, at) => {
      let messages: UsageRecorded[];
      try {
        messages = usageEventsOf(msg.subject, msg.data);
      } catch (err) {
        log.error({ err, msgId: msg.msgId, deliveryCount: msg.deliveryCount }, "invalid usage event dropped");
        observe?.("invalid");
        return;
      }
      for (const message of messages) {
        try {
          valid.push({ at, message, event: toUsageEvent(message) });
        } catch (err) {
          log.error(
            { err, msgId: msg.msgId, deliveryCount: msg.deliveryCount },
            "invalid usage event dropped",
          );
          observe?.("invalid");
        }
      }
    });
    let applied: Applied[];
    try {
      applied = await applyUsageBatch(
        valid.map((v) => v.event),
        store,
        charging,
      );
    } catch (err) {
      // The store could say nothing: every valid event comes again, the invalid ones do not.
      log.warn({ err, events: valid.length }, "usage batch not recorded; delivered again");
      for (const v of valid) verdicts[v.at] = "retry";
      return verdicts;
    }
    const failed = { record: 0, settle: 0, commit: 0 };
    let firstError: Error | undefined;
    valid.forEach(({ at, message, event }, i) => {
      const a = applied[i]!;
      if ("failed" in a) {
        verdicts[at] = "retry";
        failed[a.stage]++;
        firstError ??= a.failed;
        if (a.outcome) observe?.(a.outcome, message);
        return;
      }
      if (verdicts[at] !== "retry") verdicts[at] = "ack";
      observe?.(a.outcome, message);
      log.debug(
        { requestId: event.requestId, model: event.model },
        a.outcome === "recorded" ? "usage recorded" : "duplicate usage event skipped",
      );
      if (a.settlement === "unknown") {
        // Not a reservation auth-policy knows (or older than its settlement window): nothing to do.
        log.warn({ requestId: event.requestId }, "reservation unknown to auth-policy");
      } else if (a.settlement) {
        log.debug({ requestId: event.requestId, settlement: a.settlement }, "reservation settled");
      }
      if (a.paidCommit) {
        charging.observePaidCommit?.(a.paidCommit);
        if (a.paidCommit !== "committed") {
          // Nothing to retry: the hold will never be charged (api-edge released it, it lapsed
          // before this event came, or mpp-payment no longer knows it).
          log.warn(
            { requestId: event.requestId, reservationId: event.paidHold?.reservationId, hold: a.paidCommit },
            "paid hold not committed from its usage event",
          );
        }
      }
    });
    if (firstError) {
      // One line per batch, not per event: an outage would otherwise log every event every second.
      log.warn(
        {
          notRecorded: failed.record,
          notSettled: failed.settle,
          notCommitted: failed.commit,
          err: firstError,
        },
        "usage events not applied; delivered again",
      );
    }
    return verdicts;
  };

  const subscribe = (durable: string, subject: string): Promise<BusSubscription> => {
    if (bus.subscribeBatch) {
      return bus.subscribeBatch(durable, subject, handle, {
        ...(batching.maxEvents !== undefined ? { maxMessages: batching.maxEvents } : {}),
        ...(batching.lingerMs !== undefined ? { lingerMs: batching.lingerMs } : {}),
      });
    }
    // A bus without batches: each message is a batch of one.
    return bus.subscribe(durable, subject, async (msg) => {
      const [verdict] = await handle([msg]);
      if (verdict === "retry") throw new Error("usage event not applied");
    });
  };
  const single = await subscribe(names.meteringDurable, names.usageRecorded);
  let batches: BusSubscription;
  try {
    batches = await subscribe(names.meteringBatchDurable, names.usageBatch);
  } catch (err) {
    await single.stop();
    throw err;
  }
  return {
    async stop() {
      await Promise.all([single.stop(), batches.stop()]);
    },
    async pending() {
      const [a, b] = await Promise.all([single.pending(), batches.pending()]);
      return a + b;
    },
  };
}
