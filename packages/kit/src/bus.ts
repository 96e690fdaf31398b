import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import {
  createInbox,
  headers,
  type Msg,
  type NatsConnection,
  nanos,
  type Status,
} from "@nats-io/transport-node";
import { ExpiringIds } from "./memory-window.js";
import { ensureStream, type StreamSpec } from "./nats.js";

/** One delivered event. */
export interface BusMessage {
  subject: string;
  data: Uint8Array;
  /** The publisher's message id (JetStream Nats-Msg-Id). */
  msgId: string;
  /** 1 on first delivery, higher on redelivery. */
  deliveryCount: number;
}

/** Handles one event; a rejection means "not recorded, deliver again later". */
export type BusHandler = (msg: BusMessage) => Promise<void>;

/** What became of one message of a batch: acknowledged, delivered again later, or dropped for good. */
export type BatchVerdict = "ack" | "retry" | "drop";

/**
 * Handles a batch of events; answers one verdict per message, in order. A rejection (or a
 * missing verdict) means "deliver again later" for every message without one.
 */
export type BusBatchHandler = (msgs: BusMessage[]) => Promise<BatchVerdict[]>;

/** How a batch subscription groups messages. */
export interface BatchOptions {
  /** Most messages per batch. Default 256. */
  maxMessages?: number;
  /**
   * How long to wait, once a message is in hand, for more to join its batch (ms). Default 0:
   * a batch is whatever arrived while the previous one was being handled.
   */
  lingerMs?: number;
}

const DEFAULT_BATCH = 256;

/** A running durable subscription. */
export interface BusSubscription {
  /** Stops taking new messages and waits for the one in hand. */
  stop(): Promise<void>;
  /** Messages published but not yet acknowledged by this durable consumer. */
  pending(): Promise<number>;
}

/**
 * A durable, deduplicating event bus: JetStream in deployments, memory in the all-in-one
 * process with no NATS_URL. Publishing with a msgId already seen in the duplicate window
 * stores nothing new; a durable subscription receives each stored message at least once.
 */
export interface EventBus {
  /**
   * Resolves once the message is stored. `timeoutMs` shortens how long an unanswered publish
   * waits before it fails (never beyond the bus's own limit); a bus with no wait ignores it.
   */
  publish(subject: string, data: Uint8Array, msgId: string, timeoutMs?: number): Promise<void>;
  subscribe(durable: string, filterSubject: string, handler: BusHandler): Promise<BusSubscription>;
  /**
   * A durable subscription handed whole batches: every message that arrived while the previous
   * batch was handled (up to maxMessages), each acknowledged, redelivered or dropped by its own
   * verdict once the handler resolves. Optional for buses written for tests.
   */
  subscribeBatch?(
    durable: string,
    filterSubject: string,
    handler: BusBatchHandler,
    opts?: BatchOptions,
  ): Promise<BusSubscription>;
  close(): Promise<void>;
}

const REDELIVERY_DELAY_MS = 1_000;
/** How long a JetStream publish waits for its ack before it fails (and is retried by its caller). */
const PUBLISH_TIMEOUT_MS = 5_000;
/** How long a pull for the first message of a batch waits on the server before it is sent again. */
const BLOCKING_PULL_MS = 5_000;
/** How long past its own expiry a pull may go unanswered (a NATS restart loses it) before it is sent again. */
const PULL_GRACE_MS = 2_000;

const ACK = new TextEncoder().encode("+ACK");
const TERM = new TextEncoder().encode("+TERM");
const NAK_LATER = new TextEncoder().encode(`-NAK ${JSON.stringify({ delay: nanos(REDELIVERY_DELAY_MS) })}`);
const NAK = new TextEncoder().encode("-NAK");

/**
 * The delivery count, the stream sequence and the messages still pending after it, from a
 * JetStream ack subject:
 * `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>`, or the
 * same with a domain and an account hash after `$JS.ACK` (11 tokens or more).
 */
function ackSubjectInfo(reply: string): { deliveryCount: number; streamSeq: string; pending: number } {
  const t = reply.split(".");
  const at = t.length >= 11 ? 6 : 4;
  return { deliveryCount: Number(t[at]) || 1, streamSeq: t[at + 1] ?? "", pending: Number(t[at + 4]) || 0 };
}

/**
 * JetStream publishes and their acks over one wildcard reply subscription: a publish is one PUB
 * with a reply subject and one ack message back, with no per-publish subscription, promise race,
 * error object or timer (the nats.js request path builds all of those for every publish;
 * docs/performance.md, "The usage pipeline"). Unanswered publishes fail after `timeoutMs`, or
 * the shorter timeout a publish asks for (within the sweep's 250 ms).
 */
function jetStreamPublisher(nc: NatsConnection, timeoutMs = PUBLISH_TIMEOUT_MS) {
  const prefix = `${createInbox()}.`;
  type Waiting = { resolve: () => void; reject: (err: Error) => void; deadline: number };
  const waiting = new Map<string, Waiting>();
  let next = 0;
  nc.subscribe(`${prefix}*`, {
    callback: (err, msg) => {
      if (err) return;
      const token = msg.subject.slice(prefix.length);
      const w = waiting.get(token);
      if (!w) return;
      waiting.delete(token);
      if (msg.data.length === 0) {
        // A status: 503 when no stream listens on the subject (JetStream down or restarting).
        const code = msg.headers?.code ?? 0;
        w.reject(new Error(code === 503 ? "no responders" : `jetstream publish failed: status ${code}`));
        return;
      }
      try {
        const ack = msg.json<{ stream?: string; error?: { code?: number; description?: string } }>();
        if (ack.error)
          w.reject(new Error(`jetstream publish failed: ${ack.error.description ?? ack.error.code}`));
        else if (!ack.stream) w.reject(new Error("jetstream publish failed: invalid ack"));
        else w.resolve();
      } catch (e) {
        w.reject(e instanceof Error ? e : new Error(String(e)));
      }
    },
  });
  // One timer for every publish in flight, not one each.
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [token, w] of waiting) {
      if (w.deadline > now) continue;
      waiting.delete(token);
      w.reject(new Error("jetstream publish timed out"));
    }
  }, 250);
  sweep.unref();
  nc.closed().then(
    () => clearInterval(sweep),
    () => clearInterval(sweep),
  );
  return {
    publish(subject: string, data: Uint8Array, msgId: string, waitMs = timeoutMs): Promise<void> {
      const token = (next++).toString(36);
      const h = headers();
      h.set("Nats-Msg-Id", msgId);
      return new Promise<void>((resolve, reject) => {
        waiting.set(token, { resolve, reject, deadline: Date.now() + Math.min(waitMs, timeoutMs) });
        try {
          nc.publish(subject, data, { reply: `${prefix}${token}`, headers: h });
        } catch (err) {
          waiting.delete(token);
          reject(err);
        }
      });
    },
    close() {
      clearInterval(sweep);
    },
  };
}

/** The JetStream bus over one stream. */
export async function createJetStreamBus(nc: NatsConnection, stream: StreamSpec): Promise<EventBus> {
  await ensureStream(nc, stream);
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc);
  const publisher = jetStreamPublisher(nc);
  return {
    publish: publisher.publish,
    async subscribe(durable, filterSubject, handler) {
      await ensureConsumer(durable, filterSubject);
      const consumer = await js.consumers.get(stream.name, durable);
      const messages = await consumer.consume({ max_messages: 64 });
      const loop = (async () => {
        for await (const m of messages) {
          try {
            await handler({
              subject: m.subject,
              data: m.data,
              msgId: m.headers?.get("Nats-Msg-Id") ?? `${m.seq}`,
              deliveryCount: m.info.deliveryCount,
            });
            m.ack();
          } catch {
            m.nak(REDELIVERY_DELAY_MS);
          }
        }
      })();
      return {
        async stop() {
          await messages.close();
          await loop;
        },
        async pending() {
          const info = await jsm.consumers.info(stream.name, durable);
          return info.num_pending + info.num_ack_pending;
        },
      };
    },
    /**
     * Pulls, rather than has pushed, so a batch crosses the connection as one run of messages:
     * after a batch it waits lingerMs and then asks for everything stored meanwhile (up to
     * maxMessages, a no-wait pull); only when nothing is waiting does it ask for one message and
     * wait for it (docs/architecture.md, "Metering in batches"). A batch that filled up, or left
     * messages behind, is followed at once by the next pull.
     */
    async subscribeBatch(durable, filterSubject, handler, opts = {}) {
      await ensureConsumer(durable, filterSubject);
      const max = opts.maxMessages ?? DEFAULT_BATCH;
      const lingerMs = opts.lingerMs ?? 0;
      const next = `$JS.API.CONSUMER.MSG.NEXT.${stream.name}.${durable}`;
      const prefix = `${createInbox()}.`;
      // Delivered and not yet handled, whichever pull brought them.
      const queue: Msg[] = [];
      let pull: { token: string; want: number; got: number; done: () => void } | undefined;
      let pulls = 0;
      let stopping = false;
      let interrupt: (() => void) | undefined;
      const sub = nc.subscribe(`${prefix}*`, {
        callback: (err, msg) => {
          if (err) return;
          if (msg.data.length === 0 && msg.headers?.code) {
            // A status, sent to the pull's own reply subject, ends that pull: 404 (nothing
            // stored), 408 (expired, or no more for a no-wait pull), 409.
            const mine = pull !== undefined && msg.subject.slice(prefix.length) === pull.token;
            if (mine && msg.headers.code !== 100) pull!.done();
            return;
          }
          if (!msg.reply) return;
          // A message carries its own subject, not the pull's: it counts toward the pull in
          // hand (one that outlived its own pull is handled all the same).
          queue.push(msg);
          if (pull && ++pull.got >= pull.want) pull.done();
        },
      });
      // A pull sent before a reconnect may be lost with the old connection: end it at once, so
      // the next is sent now rather than when its grace runs out.
      const status = nc.status() as AsyncIterable<Status> & { stop?: () => void };
      const watching = (async () => {
        for await (const s of status) if (s.type === "reconnect") pull?.done();
      })();
      // Sends a pull and waits until it ends (a status, `want` messages, or its grace) or stop.
      const pullMessages = (want: number, noWait: boolean) =>
        new Promise<void>((resolve) => {
          const token = (pulls++).toString(36);
          const expiresMs = noWait ? 0 : BLOCKING_PULL_MS;
          const timer = setTimeout(() => finish(), expiresMs + PULL_GRACE_MS);
          const finish = () => {
            clearTimeout(timer);
            if (pull?.token === token) pull = undefined;
            interrupt = undefined;
            resolve();
          };
          pull = { token, want, got: 0, done: finish };
          interrupt = finish;
          const request = noWait
            ? { batch: want, no_wait: true }
            : { batch: want, expires: nanos(expiresMs) };
          nc.publish(next, JSON.stringify(request), { reply: `${prefix}${token}` });
        });
      const linger = () =>
        new Promise<void>((resolve) => {
          const timer = setTimeout(() => finish(), lingerMs);
          const finish = () => {
            clearTimeout(timer);
            interrupt = undefined;
            resolve();
          };
          interrupt = finish;
        });
      const handling = (async () => {
        let backlog = false;
        while (!stopping) {
          if (!backlog && lingerMs > 0 && queue.length < max) await linger();
          if (stopping) break;
          if (queue.length < max) await pullMessages(max - queue.length, true);
          if (queue.length === 0 && !stopping) {
            await pullMessages(1, false);
            if (queue.length === 0) continue;
            if (lingerMs > 0 && !stopping) await linger();
            if (queue.length < max && !stopping) await pullMessages(max - queue.length, true);
          }
          if (stopping) break;
          const batch = queue.splice(0, max);
          const infos = batch.map((m) => ackSubjectInfo(m.reply!));
          backlog = batch.length === max || infos.at(-1)!.pending > 0;
          let verdicts: BatchVerdict[] = [];
          try {
            verdicts = await handler(
              batch.map((m, i) => ({
                subject: m.subject,
                data: m.data,
                // Without a message id, its stream sequence: the same on every redelivery (the
                // reply subject is not; it counts deliveries).
                msgId: m.headers?.get("Nats-Msg-Id") || infos[i]!.streamSeq,
                deliveryCount: infos[i]!.deliveryCount,
              })),
            );
          } catch {
            // Every message of the batch is delivered again.
          }
          batch.forEach((m, i) => {
            const verdict = verdicts[i] ?? "retry";
            nc.publish(m.reply!, verdict === "ack" ? ACK : verdict === "drop" ? TERM : NAK_LATER);
          });
        }
      })();
      return {
        async stop() {
          stopping = true;
          interrupt?.();
          await handling;
          status.stop?.();
          await watching;
          sub.unsubscribe();
          // Taken from the server but never handled: another consumer may have them now.
          for (const m of queue.splice(0)) nc.publish(m.reply!, NAK);
        },
        async pending() {
          const info = await jsm.consumers.info(stream.name, durable);
          return info.num_pending + info.num_ack_pending;
        },
      };
    },
    async close() {
      publisher.close();
    },
  };

  async function ensureConsumer(durable: string, filterSubject: string): Promise<void> {
    try {
      await jsm.consumers.info(stream.name, durable);
    } catch {
      await jsm.consumers.add(stream.name, {
        durable_name: durable,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        filter_subject: filterSubject,
        ack_wait: nanos(30_000),
        max_deliver: -1,
      });
    }
  }
}

/** The in-memory bus, and what it holds (for tests of its memory). */
export interface MemoryBus extends EventBus {
  subscribeBatch: NonNullable<EventBus["subscribeBatch"]>;
  /** Messages kept for a subscription, and msgIds remembered for the duplicate window. */
  retained(): { messages: number; msgIds: number };
}

/**
 * The in-memory bus for the all-in-one process without NATS: the same contract (dedupe by
 * msgId, at-least-once per durable, redelivery after a failed handler) inside one process. Its
 * memory stays flat under sustained load: a message every running subscription has handled is
 * dropped, and a msgId is forgotten once the duplicate window has passed (as JetStream does).
 */
export function createMemoryBus(duplicateWindowMs = 120_000): MemoryBus {
  type Entry = { subject: string; data: Uint8Array; msgId: string };
  // entries[i] is message number offset + i; a cursor is a message number.
  let entries: Entry[] = [];
  let offset = 0;
  const end = () => offset + entries.length;
  const at = (n: number) => entries[n - offset];
  // The msgIds published within the duplicate window.
  const seen = new ExpiringIds(duplicateWindowMs);
  const consumers = new Set<() => void>();
  const cursors = new Set<{ cursor: number }>();
  let closed = false;

  // Drops the messages every running subscription is past, in chunks (amortised O(1)).
  const trim = () => {
    if (cursors.size === 0) return;
    let min = end();
    for (const c of cursors) min = Math.min(min, c.cursor);
    const drop = min - offset;
    if (drop > 0 && (drop >= 1_024 || drop * 2 >= entries.length)) {
      entries = entries.slice(drop);
      offset = min;
    }
  };

  const follow = () => {
    const c = { cursor: offset };
    cursors.add(c);
    return c;
  };

  const subscribeBatch: MemoryBus["subscribeBatch"] = async (_durable, filterSubject, handler, opts = {}) => {
    const prefix = filterSubject.endsWith(">") ? filterSubject.slice(0, -1) : undefined;
    const matches = (s: string) => (prefix !== undefined ? s.startsWith(prefix) : s === filterSubject);
    const max = opts.maxMessages ?? DEFAULT_BATCH;
    const lingerMs = opts.lingerMs ?? 0;
    const position = follow();
    let running = true;
    let wake: () => void = () => {};
    const wakeUp = () => wake();
    consumers.add(wakeUp);
    const loop = (async () => {
      while (running && !closed) {
        if (position.cursor >= end()) {
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
          continue;
        }
        if (lingerMs > 0 && end() - position.cursor < max) {
          await new Promise((r) => setTimeout(r, lingerMs));
        }
        let next = position.cursor;
        let batch: BusMessage[] = [];
        while (next < end() && batch.length < max) {
          const m = at(next++)!;
          if (matches(m.subject)) batch.push({ ...m, deliveryCount: 1 });
        }
        // Delivers again, after a delay, only the messages whose verdict was "retry".
        while (batch.length > 0) {
          let verdicts: BatchVerdict[] = [];
          try {
            verdicts = await handler(batch);
          } catch {
            // The whole batch again.
          }
          batch = batch
            .filter((_, i) => (verdicts[i] ?? "retry") === "retry")
            .map((m) => ({ ...m, deliveryCount: m.deliveryCount + 1 }));
          if (batch.length > 0) {
            await new Promise((r) => setTimeout(r, REDELIVERY_DELAY_MS));
            if (!running) return;
          }
        }
        position.cursor = next;
        trim();
      }
    })();
    return {
      async stop() {
        running = false;
        consumers.delete(wakeUp);
        wake();
        await loop;
        cursors.delete(position);
      },
      async pending() {
        return end() - position.cursor;
      },
    };
  };

  return {
    retained: () => ({ messages: entries.length, msgIds: seen.size }),
    async publish(subject, data, msgId) {
      if (!seen.add(msgId, Date.now())) return;
      entries.push({ subject, data, msgId });
      for (const wake of consumers) wake();
    },
    // One message at a time is a batch of one: a handler that throws has it delivered again.
    subscribe(durable, filterSubject, handler) {
      return subscribeBatch(
        durable,
        filterSubject,
        async ([msg]) => {
          await handler(msg!);
          return ["ack"];
        },
        { maxMessages: 1 },
      );
    },
    subscribeBatch,
    async close() {
      closed = true;
      for (const wake of consumers) wake();
    },
  };
}
