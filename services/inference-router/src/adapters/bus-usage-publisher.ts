import { createHash } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { EventBus } from "@tollgate/kit/bus";
import type { Logger } from "@tollgate/kit/log";
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
 * How long a usage event is retried before the request fails with usage_not_recorded, counted
 * for each event from when it was given to the publisher: long enough to ride out a NATS restart
 * or a JetStream leader change. Past it the caller gets a 503
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

/** How a bus usage publisher logs, and how long and how many events it waits and batches. */
export interface BusUsagePublisherOptions {
  /** A batch's failed attempt (warn, once per batch) and every event given up (error, one line each). */
  log: Logger;
  /** How long each event is retried, from when it was given to publish(). */
  deadlineMs?: number;
  /** Most events in one UsageBatch. */
  maxBatch?: number;
}

const NONE: never[] = [];

/**
 * Publishes usage events to JetStream, retrying with backoff until each event's own deadline
 * (`deadlineMs` after its publish() call) has passed. Adaptive batching, with no wait of its own
 * (docs/architecture.md, "The bus"): an event is published at once, alone as UsageRecorded with
 * its event id as message id, when no publish is awaiting its ack; the events that arrive while
 * one is go out together, as one UsageBatch, as soon as it returns. One request at a time is never
 * delayed; under load a router sends a few messages where it would send hundreds. Every caller's
 * publish() resolves only once the message carrying its event is stored, and rejects at its event's
 * deadline when that message could not be stored by then: an event that joined a batch late keeps
 * its whole deadline, the batch is retried (the same bytes and message id) until its last event's
 * deadline, and no attempt waits for its ack past that (docs/runbooks/inference-router.md,
 * "Recovery").
 */
export function createBusUsagePublisher(
  bus: EventBus,
  subjects: UsageSubjects,
  opts: BusUsagePublisherOptions,
): UsagePublisher {
  const { log, deadlineMs = PUBLISH_DEADLINE_MS, maxBatch = MAX_BATCH_EVENTS } = opts;
  type Waiting = {
    message: UsageRecorded;
    deadline: number;
    resolve: () => void;
    reject: (err: unknown) => void;
  };
  // Events in arrival order, so in deadline order: those not sent yet, and the batch being sent,
  // whose first `answered` events are answered already (their deadline passed).
  let waiting: Waiting[] = [];
  let sending: Waiting[] = NONE;
  let answered = 0;
  let draining = false;
  // Why the last attempt failed (until one succeeds): what an event given up is rejected with.
  let lastError: unknown;
  // One timer for all events, never one each: armed at or before the earliest deadline of the
  // events not answered yet, it answers those whose deadline passed and arms itself again.
  let timer: NodeJS.Timeout | undefined;

  const giveUp = (w: Waiting, err: unknown) => {
    log.error(
      { eventId: w.message.eventId, requestId: w.message.requestId, err },
      "usage event not recorded: its publish deadline passed",
    );
    w.reject(err);
  };

  /** Rejects every event whose deadline has passed, in the batch being sent or not sent yet. */
  function expire(now: number): void {
    const due = (w: Waiting | undefined) => w !== undefined && w.deadline <= now;
    if (!due(sending[answered]) && !due(waiting[0])) return;
    const err = lastError ?? new Error(`usage event not stored within ${deadlineMs} ms`);
    while (due(sending[answered])) giveUp(sending[answered++]!, err);
    let gone = 0;
    while (due(waiting[gone])) giveUp(waiting[gone++]!, err);
    if (gone > 0) waiting.splice(0, gone);
  }

  function arm(): void {
    const next = (sending[answered] ?? waiting[0])?.deadline;
    if (next === undefined) return;
    timer = setTimeout(
      () => {
        timer = undefined;
        expire(Date.now());
        arm();
      },
      Math.max(0, next - Date.now()),
    );
    // A publish still retried does not hold up an exit (as kit/retry's pauses do not).
    timer.unref();
  }

  /** Sends one batch, the same bytes and message id on every attempt, until it is answered. */
  async function deliver(batch: Waiting[]): Promise<void> {
    let subject: string;
    let data: Uint8Array;
    let msgId: string;
    if (batch.length === 1) {
      const { message } = batch[0]!;
      subject = subjects.recorded;
      data = encodeMessage(UsageRecordedSchema, message);
      msgId = message.eventId;
    } else {
      const events = batch.map((w) => w.message);
      subject = subjects.batch;
      data = encodeMessage(UsageBatchSchema, { events });
      msgId = batchMsgId(events.map((e) => e.eventId));
    }
    const last = batch.at(-1)!.deadline;
    let delay = FIRST_BACKOFF_MS;
    for (let attempt = 1; ; attempt++) {
      try {
        // No attempt waits for its ack past the last deadline it carries.
        await bus.publish(subject, data, msgId, Math.max(0, last - Date.now()));
      } catch (err) {
        lastError = err;
        const now = Date.now();
        expire(now);
        if (answered === batch.length) return;
        if (attempt === 1)
          log.warn(
            { events: batch.length - answered, err },
            "usage publish failed; retrying until each event's deadline",
          );
        // A pause never runs past the last deadline: once that passes, every event is answered.
        await sleep(Math.min(delay, last - now));
        delay = Math.min(delay * 2, MAX_BACKOFF_MS);
        expire(Date.now());
        if (answered === batch.length) return;
        continue;
      }
      lastError = undefined;
      // Events given up before this ack were stored all the same (their holds are settled).
      if (attempt > 1 || answered > 0)
        log.info(
          { events: batch.length, attempts: attempt, givenUp: answered },
          "usage publish stored after retries",
        );
      while (answered < batch.length) batch[answered++]!.resolve();
      return;
    }
  }

  async function drain(): Promise<void> {
    draining = true;
    for (;;) {
      // An event whose deadline passed while it waited is answered, not sent.
      expire(Date.now());
      if (waiting.length === 0) break;
      sending = waiting.length <= maxBatch ? waiting : waiting.slice(0, maxBatch);
      waiting = waiting.length <= maxBatch ? [] : waiting.slice(maxBatch);
      answered = 0;
      await deliver(sending);
      sending = NONE;
    }
    draining = false;
  }

  return {
    publish(e: UsageEvent) {
      const message = usageRecordedOf(e);
      return new Promise<void>((resolve, reject) => {
        waiting.push({ message, deadline: Date.now() + deadlineMs, resolve, reject });
        if (timer === undefined) arm();
        if (!draining) void drain();
      });
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, Math.max(0, ms)).unref());
