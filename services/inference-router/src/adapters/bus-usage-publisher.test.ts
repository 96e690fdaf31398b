import { fromBinary, toBinary } from "@bufbuild/protobuf";
import type { EventBus } from "@tollgate/kit/bus";
import { createLogger } from "@tollgate/kit/log";
import { UsageBatchSchema, UsageOperation, UsageRecordedSchema } from "@tollgate/proto/usage";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { UsageEvent, UsagePublisher } from "../domain/ports.js";
import {
  batchMsgId,
  createBusUsagePublisher,
  usageRecordedOf,
  usageRecordedSoFar,
} from "./bus-usage-publisher.js";

const SUBJECTS = { recorded: "usage.recorded", batch: "usage.batch" };
const QUIET = createLogger({ service: "inference-router", level: "silent" });

const EVENT: UsageEvent = {
  eventId: "evt_1",
  occurredAt: new Date("2025-03-10T12:00:00Z"),
  requestId: "req_1",
  door: "account",
  accountId: "acct_1",
  connectionId: "conn_1",
  keyId: "key_1",
  model: "small",
  runtime: "vllm",
  upstreamId: "up-1",
  tokens: { inputTokens: 5, outputTokens: 3, reasoningTokens: 0 },
  cost: 42n,
  pricingSnapshotId: "ps_1",
  reservationId: "rsv_1",
  outcome: "completed",
  streamed: true,
  operation: "chat",
};

/** A bus whose publish fails the first `failures` times, keeping every attempt. */
function flakyBus(failures: number) {
  const attempts: Array<{ subject: string; data: Uint8Array; msgId: string; at: number }> = [];
  const bus: EventBus = {
    async publish(subject, data, msgId) {
      attempts.push({ subject, data, msgId, at: Date.now() });
      if (attempts.length <= failures) throw new Error("no responders");
    },
    subscribe: () => Promise.reject(new Error("not used")),
    close: async () => {},
  };
  return { bus, attempts };
}

describe("createBusUsagePublisher", () => {
  it("publishes the operation that served the request", async () => {
    const { bus, attempts } = flakyBus(0);
    const publisher = createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 5_000 });
    await publisher.publish({
      ...EVENT,
      operation: "embeddings",
      tokens: { ...EVENT.tokens, outputTokens: 0 },
    });
    await publisher.publish({ ...EVENT, eventId: "evt_2" });
    const stored = attempts.map((a) => fromBinary(UsageRecordedSchema, a.data));
    expect(stored.map((s) => s.operation)).toEqual([UsageOperation.EMBEDDINGS, UsageOperation.CHAT]);
    expect(stored[0]?.outputTokens).toBe(0);
  });

  it("publishes the paid hold's channel, and none for the account door", async () => {
    const { bus, attempts } = flakyBus(0);
    const publisher = createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 5_000 });
    const channelId = `0x${"cd".repeat(32)}`;
    await publisher.publish({ ...EVENT, door: "paid", reservationId: `rsv_${"2".repeat(32)}`, channelId });
    await publisher.publish({ ...EVENT, eventId: "evt_2" });
    const stored = attempts.map((a) => fromBinary(UsageRecordedSchema, a.data));
    expect(stored.map((s) => [s.reservationId, s.channelId])).toEqual([
      [`rsv_${"2".repeat(32)}`, channelId],
      ["rsv_1", ""],
    ]);
  });

  it("retries a failed publish with backoff and the same message id until it is stored", async () => {
    const { bus, attempts } = flakyBus(4);
    await createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 5_000 }).publish(EVENT);
    expect(attempts).toHaveLength(5);
    expect(new Set(attempts.map((a) => a.msgId))).toEqual(new Set(["evt_1"]));
    // 100, 200, 400, 800 ms between attempts: together well past a short three-try budget.
    expect(attempts.at(-1)!.at - attempts[0]!.at).toBeGreaterThanOrEqual(1_400);
    const stored = fromBinary(UsageRecordedSchema, attempts.at(-1)!.data);
    expect([stored.eventId, stored.cost, stored.outputTokens]).toEqual(["evt_1", "42", 3]);
  });

  it("gives up once the deadline has passed, so the request fails with usage_not_recorded", async () => {
    const { bus, attempts } = flakyBus(Number.POSITIVE_INFINITY);
    const started = Date.now();
    await expect(
      createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 400 }).publish(EVENT),
    ).rejects.toThrow("no responders");
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(attempts.length).toBeGreaterThanOrEqual(2);
  });
});

/** A bus whose publishes wait until the test acks (or fails) them, one by one, in order. */
function gatedBus() {
  type Attempt = {
    subject: string;
    data: Uint8Array;
    msgId: string;
    ack: () => void;
    fail: (e: Error) => void;
  };
  const attempts: Attempt[] = [];
  const bus: EventBus = {
    // As the real bus does, an attempt not answered within its ack wait fails: the publisher
    // counts on that to finish an attempt it started just before the last deadline.
    publish: (subject, data, msgId, timeoutMs) =>
      new Promise<void>((ack, fail) => {
        attempts.push({ subject, data, msgId, ack, fail });
        if (timeoutMs !== undefined)
          setTimeout(() => fail(new Error("ack wait timed out")), timeoutMs).unref();
      }),
    subscribe: () => Promise.reject(new Error("not used")),
    close: async () => {},
  };
  return { bus, attempts };
}

const tick = () => new Promise((r) => setTimeout(r, 5));

describe("createBusUsagePublisher: adaptive batching", () => {
  it("publishes one event alone, at once, when nothing is awaiting an ack", async () => {
    const { bus, attempts } = gatedBus();
    const publisher = createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 5_000 });
    const done = publisher.publish(EVENT);
    await tick();
    expect(attempts.map((a) => [a.subject, a.msgId])).toEqual([["usage.recorded", "evt_1"]]);
    attempts[0]!.ack();
    await done;
  });

  it("sends the events that came during a publish as one batch when it returns, each caller answered only after its message's ack", async () => {
    const { bus, attempts } = gatedBus();
    const publisher = createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 5_000 });
    const answered: string[] = [];
    const publishing = ["evt_1", "evt_2", "evt_3", "evt_4"].map((eventId) =>
      publisher.publish({ ...EVENT, eventId }).then(() => void answered.push(eventId)),
    );
    await tick();
    // evt_1 went alone; the others wait for its ack, unanswered.
    expect(attempts).toHaveLength(1);
    expect(answered).toEqual([]);
    attempts[0]!.ack();
    await tick();
    expect(answered).toEqual(["evt_1"]);
    expect(attempts).toHaveLength(2);
    const batch = attempts[1]!;
    expect(batch.subject).toBe("usage.batch");
    const events = fromBinary(UsageBatchSchema, batch.data).events;
    expect(events.map((e) => e.eventId)).toEqual(["evt_2", "evt_3", "evt_4"]);
    expect(events.map((e) => e.cost)).toEqual(["42", "42", "42"]);
    expect(batch.msgId).toBe(batchMsgId(["evt_2", "evt_3", "evt_4"]));
    // Not stored yet: nobody in the batch is answered.
    await tick();
    expect(answered).toEqual(["evt_1"]);
    batch.ack();
    await Promise.all(publishing);
    expect(answered).toEqual(["evt_1", "evt_2", "evt_3", "evt_4"]);
  });

  it("retries a batch with the same bytes and message id, so JetStream stores it once", async () => {
    const { bus, attempts } = gatedBus();
    const publisher = createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 5_000 });
    const first = publisher.publish(EVENT);
    const rest = [
      publisher.publish({ ...EVENT, eventId: "evt_2" }),
      publisher.publish({ ...EVENT, eventId: "evt_3" }),
    ];
    await tick();
    attempts[0]!.ack();
    await first;
    await tick();
    attempts[1]!.fail(new Error("timed out"));
    await vi.waitFor(() => expect(attempts).toHaveLength(3), { timeout: 2_000, interval: 10 });
    attempts[2]!.fail(new Error("timed out"));
    await vi.waitFor(() => expect(attempts).toHaveLength(4), { timeout: 2_000, interval: 10 });
    attempts[3]!.ack();
    await Promise.all(rest);
    const retries = attempts.slice(1);
    expect(new Set(retries.map((a) => a.msgId)).size).toBe(1);
    for (const a of retries) expect(Buffer.from(a.data).equals(Buffer.from(retries[0]!.data))).toBe(true);
  });

  it("rejects every caller of a batch that could not be stored in time, and goes on with the next", async () => {
    const { bus, attempts } = gatedBus();
    const publisher = createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 300 });
    const first = publisher.publish(EVENT);
    const batch = [
      publisher.publish({ ...EVENT, eventId: "evt_2" }),
      publisher.publish({ ...EVENT, eventId: "evt_3" }),
    ];
    const outcomes = Promise.allSettled(batch);
    await tick();
    attempts[0]!.ack();
    await first;
    // Every attempt at the batch fails until the deadline has passed.
    const failing = setInterval(() => {
      for (const a of attempts.slice(1)) a.fail(new Error("no responders"));
    }, 5);
    const settled = await outcomes;
    clearInterval(failing);
    expect(settled.map((s) => s.status)).toEqual(["rejected", "rejected"]);
    // The publisher is not stuck: a later event goes out alone.
    const later = publisher.publish({ ...EVENT, eventId: "evt_4" });
    await vi.waitFor(() => expect(attempts.at(-1)?.msgId).toBe("evt_4"), { timeout: 1_000, interval: 5 });
    attempts.at(-1)!.ack();
    await later;
  });
});

/** A bus that answers each attempt as `answer` says, keeping when it came and the ack wait it asked for. */
function scriptedBus(answer: (attempt: number) => Promise<void>) {
  const attempts: Array<{ subject: string; msgId: string; at: number; timeoutMs: number | undefined }> = [];
  const bus: EventBus = {
    publish(subject, _data, msgId, timeoutMs) {
      attempts.push({ subject, msgId, at: Date.now(), timeoutMs });
      return answer(attempts.length);
    },
    subscribe: () => Promise.reject(new Error("not used")),
    close: async () => {},
  };
  return { bus, attempts };
}

const after = (ms: number, outcome: "ack" | Error) =>
  new Promise<void>((ack, fail) => setTimeout(() => (outcome === "ack" ? ack() : fail(outcome)), ms));

/** publish(), noting how and when (ms after `start`) each caller was answered. */
function noting(publisher: UsagePublisher, start: number) {
  const answers = new Map<string, string>();
  const publish = (eventId: string) =>
    publisher.publish({ ...EVENT, eventId, requestId: `req_${eventId}` }).then(
      () => void answers.set(eventId, `stored at ${Date.now() - start}`),
      (err: Error) => void answers.set(eventId, `${err.message} at ${Date.now() - start}`),
    );
  return { answers, publish };
}

/**
 * evt_1 and evt_2 given to a publisher with a 1000 ms deadline at 0 ms, evt_3 at `lateAt`, over a
 * bus answering as `answer` says (given the attempt's number and its time): how each caller was
 * answered and every attempt, `runFor` ms on, all timed from the start (fake timers).
 */
async function threeEvents(
  answer: (attempt: number, at: number) => Promise<void>,
  lateAt: number,
  runFor: number,
) {
  const start = Date.now();
  const { bus, attempts } = scriptedBus((n) => answer(n, Date.now() - start));
  const { answers, publish } = noting(
    createBusUsagePublisher(bus, SUBJECTS, { log: QUIET, deadlineMs: 1_000 }),
    start,
  );
  const all = [publish("evt_1"), publish("evt_2")];
  await vi.advanceTimersByTimeAsync(lateAt);
  all.push(publish("evt_3"));
  await vi.advanceTimersByTimeAsync(runFor - lateAt);
  await Promise.all(all);
  return { answers, attempts: attempts.map((a) => ({ ...a, at: a.at - start })) };
}

const NOT_STORED = "usage event not stored within 1000 ms";

describe("createBusUsagePublisher: each event's own deadline", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("gives an event that joins a batch late its whole deadline, retrying the batch after its first event is answered", async () => {
    // evt_1 goes alone and is acked at 900 ms; the batch of evt_2 (given at 0) and evt_3 (at
    // 800) fails until 1500 ms, past evt_2's deadline and before evt_3's.
    const { answers, attempts } = await threeEvents(
      (n, at) =>
        n === 1
          ? after(900, "ack")
          : at < 1_500
            ? Promise.reject(new Error("no responders"))
            : Promise.resolve(),
      800,
      2_000,
    );
    expect(answers).toEqual(
      new Map([
        ["evt_1", "stored at 900"],
        ["evt_2", "no responders at 1000"],
        ["evt_3", "stored at 1600"],
      ]),
    );
    // The batch kept its bytes' message id after evt_2 was answered: JetStream stores it once.
    const batch = attempts.slice(1);
    expect(batch.map((a) => a.at)).toEqual([900, 1_000, 1_200, 1_600]);
    expect(new Set(batch.map((a) => a.msgId))).toEqual(new Set([batchMsgId(["evt_2", "evt_3"])]));
  });

  it("answers a caller at its deadline, not when an attempt that outlasts it times out", async () => {
    // Every attempt fails 5 s after it is sent, whatever wait it asked for.
    const { answers, attempts } = await threeEvents(
      () => after(5_000, new Error("jetstream publish timed out")),
      300,
      12_000,
    );
    // evt_1's attempt is still unanswered at 1000 ms; evt_2 and evt_3 waited behind it and are
    // answered at their own deadlines, unsent.
    expect(answers).toEqual(
      new Map([
        ["evt_1", `${NOT_STORED} at 1000`],
        ["evt_2", `${NOT_STORED} at 1000`],
        ["evt_3", `${NOT_STORED} at 1300`],
      ]),
    );
    // The attempt asked to wait no longer than its event's deadline.
    expect(attempts.map((a) => [a.msgId, a.timeoutMs])).toEqual([["evt_1", 1_000]]);
  });

  it("answers the first events of a batch at their deadlines while an attempt carrying a later one is in flight", async () => {
    const { answers, attempts } = await threeEvents(
      (n) => (n === 1 ? after(100, "ack") : after(5_000, new Error("jetstream publish timed out"))),
      50,
      6_000,
    );
    expect(answers).toEqual(
      new Map([
        ["evt_1", "stored at 100"],
        ["evt_2", `${NOT_STORED} at 1000`],
        ["evt_3", `${NOT_STORED} at 1050`],
      ]),
    );
    // The batch's attempt waits for its ack no longer than its last event's deadline.
    expect(attempts.map((a) => [a.at, a.timeoutMs])).toEqual([
      [0, 1_000],
      [100, 950],
    ]);
  });

  it("logs a batch's failure once, with its events' count and the error, and every event given up with its ids", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const log = createLogger({
      service: "inference-router",
      destination: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) },
    });
    let failing = 3;
    const { bus } = scriptedBus((n) => {
      if (n === 1 || failing <= 0) return after(10, "ack");
      failing--;
      return Promise.reject(new Error("no responders"));
    });
    const { publish } = noting(createBusUsagePublisher(bus, SUBJECTS, { log, deadlineMs: 1_000 }), 0);
    // evt_1 goes alone and is stored; the batch of evt_2 and evt_3 fails three times, then is stored.
    const stored = ["evt_1", "evt_2", "evt_3"].map(publish);
    await vi.advanceTimersByTimeAsync(2_000);
    await Promise.all(stored);
    // Now every attempt fails: evt_4 goes alone and is retried until its deadline; evt_5 and
    // evt_6, waiting behind it, reach theirs unsent.
    failing = Number.POSITIVE_INFINITY;
    const lost = ["evt_4", "evt_5", "evt_6"].map(publish);
    await vi.advanceTimersByTimeAsync(3_000);
    await Promise.all(lost);
    const seen = lines.map((l) => ({
      level: l.level,
      msg: l.msg,
      events: l.events,
      attempts: l.attempts,
      givenUp: l.givenUp,
      eventId: l.eventId,
      requestId: l.requestId,
      err: (l.err as { message?: string } | undefined)?.message,
    }));
    const retrying = "usage publish failed; retrying until each event's deadline";
    const givenUp = "usage event not recorded: its publish deadline passed";
    expect(seen).toEqual([
      { level: "warn", msg: retrying, events: 2, err: "no responders" },
      { level: "info", msg: "usage publish stored after retries", events: 2, attempts: 4, givenUp: 0 },
      { level: "warn", msg: retrying, events: 1, err: "no responders" },
      { level: "error", msg: givenUp, eventId: "evt_4", requestId: "req_evt_4", err: "no responders" },
      { level: "error", msg: givenUp, eventId: "evt_5", requestId: "req_evt_5", err: "no responders" },
      { level: "error", msg: givenUp, eventId: "evt_6", requestId: "req_evt_6", err: "no responders" },
    ]);
    // Ids only: nothing of the account, the key or the usage.
    const text = JSON.stringify(lines);
    for (const secret of ["acct_1", "key_1", "conn_1", "rsv_1"]) expect(text).not.toContain(secret);
  });
});

describe("usageRecordedSoFar", () => {
  const soFar: UsageEvent = {
    ...EVENT,
    outcome: "upstream_failed",
    tokens: { inputTokens: 5, outputTokens: 1, reasoningTokens: 0 },
  };

  it("is the message usageRecordedOf makes, from the stream's message before it", () => {
    const next: UsageEvent = {
      ...soFar,
      occurredAt: new Date("2025-03-10T12:00:01Z"),
      upstreamId: "up-2",
      tokens: { inputTokens: 6, outputTokens: 2, reasoningTokens: 1 },
      cost: 43n,
    };
    const made = usageRecordedSoFar(next, usageRecordedOf(soFar));
    expect(made).toEqual(usageRecordedOf(next));
    expect(fromBinary(UsageRecordedSchema, toBinary(UsageRecordedSchema, made))).toEqual(
      usageRecordedOf(next),
    );
  });

  it("makes the whole message for the first chunk, and for another stream's event", () => {
    expect(usageRecordedSoFar(soFar, undefined)).toEqual(usageRecordedOf(soFar));
    const other: UsageEvent = { ...soFar, eventId: "evt_2", requestId: "req_2", keyId: "key_2" };
    expect(usageRecordedSoFar(other, usageRecordedOf(soFar))).toEqual(usageRecordedOf(other));
  });
});
