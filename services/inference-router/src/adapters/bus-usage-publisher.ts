import { create, toBinary } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { EventBus } from "@tollgate/kit/bus";
import { always, retrying } from "@tollgate/kit/retry";
import {
  Door,
  Outcome,
  UsageOperation,
  type UsageRecorded,
  UsageRecordedSchema,
} from "@tollgate/proto/usage";
import type { UsageEvent, UsagePublisher } from "../domain/ports.js";

const DOOR = { account: Door.ACCOUNT, paid: Door.PAID } as const;
const OPERATION = {
  chat: UsageOperation.CHAT,
  text: UsageOperation.TEXT,
  embeddings: UsageOperation.EMBEDDINGS,
} as const satisfies Record<UsageEvent["operation"], UsageOperation>;
const OUTCOME = {
  completed: Outcome.COMPLETED,
  client_cancelled: Outcome.CLIENT_CANCELLED,
  upstream_failed: Outcome.UPSTREAM_FAILED,
} as const;

/**
 * How long a usage event is retried before the request fails with usage_not_recorded: long
 * enough to ride out a NATS restart or a JetStream leader change. Past it the caller gets a 503
 * and the budget hold stays for settlement (a retried publish may still have been stored).
 */
export const PUBLISH_DEADLINE_MS = 15_000;
const FIRST_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 1_000;

/** The wire message of a usage event (published, and sent with each streamed chunk). */
export function usageRecordedOf(e: UsageEvent): UsageRecorded {
  return create(UsageRecordedSchema, {
    eventId: e.eventId,
    occurredAt: timestampFromDate(e.occurredAt),
    requestId: e.requestId,
    door: DOOR[e.door],
    accountId: e.accountId,
    connectionId: e.connectionId,
    keyId: e.keyId,
    model: e.model,
    runtime: e.runtime,
    upstreamId: e.upstreamId,
    inputTokens: e.tokens.inputTokens,
    outputTokens: e.tokens.outputTokens,
    reasoningTokens: e.tokens.reasoningTokens,
    cost: e.cost.toString(),
    pricingSnapshotId: e.pricingSnapshotId,
    reservationId: e.reservationId,
    outcome: OUTCOME[e.outcome],
    streamed: e.streamed,
    operation: OPERATION[e.operation],
  });
}

/**
 * Encodes UsageRecorded as protobuf and publishes it with the event id as message id, retrying
 * with backoff until `deadlineMs` has passed.
 */
export function createBusUsagePublisher(
  bus: EventBus,
  subject: string,
  deadlineMs = PUBLISH_DEADLINE_MS,
): UsagePublisher {
  return {
    async publish(e: UsageEvent) {
      const data = toBinary(UsageRecordedSchema, usageRecordedOf(e));
      // The same message id on every attempt: JetStream stores a retried publish once.
      await retrying(() => bus.publish(subject, data, e.eventId), always, {
        delayMs: FIRST_BACKOFF_MS,
        maxDelayMs: MAX_BACKOFF_MS,
        forMs: deadlineMs,
      });
    },
  };
}
