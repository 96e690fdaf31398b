import { createHash } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { EventBus } from "@tollgate/kit/bus";
import { always, retrying } from "@tollgate/kit/retry";
import { encodeMessage } from "@tollgate/proto/codec";
import {
  Door,
  Outcome,
  UsageBatchSchema,
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
    requestId: e.requestId,
    door: DOOR[e.door],
    accountId: e.accountId,
    connectionId: e.connectionId,
    keyId: e.keyId,
    model: e.model,
    runtime: e.runtime,
    pricingSnapshotId: e.pricingSnapshotId,
    reservationId: e.reservationId,
    channelId: e.channelId ?? "",
    outcome: OUTCOME[e.outcome],
    streamed: e.streamed,
    operation: OPERATION[e.operation],
    ...movingFields(e),
  });
}

/** The fields of a usage event that change from one chunk of a stream to the next. */
function movingFields(e: UsageEvent) {
  return {
    occurredAt: timestampFromDate(e.occurredAt),
    upstreamId: e.upstreamId,
    inputTokens: e.tokens.inputTokens,
    outputTokens: e.tokens.outputTokens,
    reasoningTokens: e.tokens.reasoningTokens,
    cost: e.cost.toString(),
  };
}

/**
 * The wire message of a stream's usage so far, given the one made for an earlier chunk of the
 * same stream (`last`, same event id): its other fields are the same for every chunk of a stream
 * (Inference.stream), so they are copied and only the moving ones set, instead of building the
 * whole message again for every chunk (docs/performance.md, "Stream time to first byte").
 * Without `last`, or for another event id, it is usageRecordedOf.
 */
export function usageRecordedSoFar(e: UsageEvent, last: UsageRecorded | undefined): UsageRecorded {
  if (!last || last.eventId !== e.eventId) return usageRecordedOf(e);
  return { ...last, ...movingFields(e) };
}

/** Where usage events go: one event alone (UsageRecorded), several together (UsageBatch). */
export interface UsageSubjects {
  recorded: string;
  batch: string;
}

/** Most events in one UsageBatch (about 200 bytes each: far below NATS's 1 MiB payload limit). */
export const MAX_BATCH_EVENTS = 256;

/**
 * The JetStream message id of a batch, derived from its events' ids alone: the retries of one
 * batch, which resend the same events, carry the same id and are stored once.
 */
export function batchMsgId(eventIds: readonly string[]): string {
  return `batch:${createHash("sha256").update(eventIds.join("\n")).digest("base64url")}`;
}

/**
 * Publishes usage events to JetStream, retrying with backoff until `deadlineMs` has passed.
 * Adaptive batching, with no wait of its own (docs/architecture.md, "The bus"): an event is
 * published at once, alone as UsageRecorded with its event id as message id, when no publish is
 * awaiting its ack; the events that arrive while one is go out together, as one UsageBatch, as
 * soon as it returns. One request at a time is never delayed; under load a router sends a few
 * messages where it would send hundreds. Every caller's publish() resolves only once the message
 * carrying its event is stored, and rejects when that message could not be stored in time.
 */
export function createBusUsagePublisher(
  bus: EventBus,
  subjects: UsageSubjects,
  deadlineMs = PUBLISH_DEADLINE_MS,
  maxBatch = MAX_BATCH_EVENTS,
): UsagePublisher {
  type Waiting = {
    message: UsageRecorded;
    since: number;
    resolve: () => void;
    reject: (err: unknown) => void;
  };
  let waiting: Waiting[] = [];
  let sending = false;

  // One message and its retries: the same bytes and message id on every attempt.
  const send = (subject: string, data: Uint8Array, msgId: string, since: number) =>
    retrying(() => bus.publish(subject, data, msgId), always, {
      delayMs: FIRST_BACKOFF_MS,
      maxDelayMs: MAX_BACKOFF_MS,
      // The deadline runs from when the oldest event came, not from when its turn did.
      forMs: Math.max(0, since + deadlineMs - Date.now()),
    });

  async function drain(): Promise<void> {
    sending = true;
    while (waiting.length > 0) {
      const batch = waiting.length <= maxBatch ? waiting : waiting.slice(0, maxBatch);
      waiting = waiting.length <= maxBatch ? [] : waiting.slice(maxBatch);
      const since = batch[0]!.since;
      try {
        if (batch.length === 1) {
          const { message } = batch[0]!;
          await send(subjects.recorded, encodeMessage(UsageRecordedSchema, message), message.eventId, since);
        } else {
          const events = batch.map((w) => w.message);
          const data = encodeMessage(UsageBatchSchema, { events });
          await send(subjects.batch, data, batchMsgId(events.map((e) => e.eventId)), since);
        }
        for (const w of batch) w.resolve();
      } catch (err) {
        for (const w of batch) w.reject(err);
      }
    }
    sending = false;
  }

  return {
    publish(e: UsageEvent) {
      const message = usageRecordedOf(e);
      return new Promise<void>((resolve, reject) => {
        waiting.push({ message, since: Date.now(), resolve, reject });
        if (!sending) void drain();
      });
    },
  };
}
