import { AckPolicy, DeliverPolicy, type JsMsg, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { type NatsConnection, nanos } from "@nats-io/transport-node";
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
  publish(subject: string, data: Uint8Array, msgId: string): Promise<void>;
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

/** The JetStream bus over one stream. */
export async function createJetStreamBus(nc: NatsConnection, stream: StreamSpec): Promise<EventBus> {
  await ensureStream(nc, stream);
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc);
  return {
    async publish(subject, data, msgId) {
      await js.publish(subject, data, { msgID: msgId, timeout: 5_000 });
    },
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
    async subscribeBatch(durable, filterSubject, handler, opts = {}) {
      await ensureConsumer(durable, filterSubject);
      const max = opts.maxMessages ?? DEFAULT_BATCH;
      const lingerMs = opts.lingerMs ?? 0;
      const consumer = await js.consumers.get(stream.name, durable);
      const messages = await consumer.consume({ max_messages: max });
      // The pull loop moves delivered messages into `queue` (at most `max` ahead of the
      // handler); the handling loop takes everything queued as one batch.
      const queue: JsMsg[] = [];
      let ended = false;
      let stopping = false;
      let wakeHandler: (() => void) | undefined;
      let wakePuller: (() => void) | undefined;
      const wake = (which: "handler" | "puller") => {
        const w = which === "handler" ? wakeHandler : wakePuller;
        if (which === "handler") wakeHandler = undefined;
        else wakePuller = undefined;
        w?.();
      };
      const pulling = (async () => {
        try {
          for await (const m of messages) {
            queue.push(m);
            wake("handler");
            while (queue.length >= max && !stopping) {
              await new Promise<void>((resolve) => {
                wakePuller = resolve;
              });
            }
          }
        } finally {
          ended = true;
          wake("handler");
        }
      })();
      const handling = (async () => {
        for (;;) {
          // Stopping: the batch in hand is finished; what is queued is handed back below.
          if (stopping) return;
          if (queue.length === 0) {
            if (ended) return;
            await new Promise<void>((resolve) => {
              wakeHandler = resolve;
            });
            continue;
          }
          if (lingerMs > 0 && queue.length < max && !stopping) {
            await new Promise((r) => setTimeout(r, lingerMs));
          }
          const batch = queue.splice(0, max);
          wake("puller");
          let verdicts: BatchVerdict[] = [];
          try {
            verdicts = await handler(
              batch.map((m) => ({
                subject: m.subject,
                data: m.data,
                msgId: m.headers?.get("Nats-Msg-Id") ?? `${m.seq}`,
                deliveryCount: m.info.deliveryCount,
              })),
            );
          } catch {
            // Every message of the batch is delivered again.
          }
          batch.forEach((m, i) => {
            const verdict = verdicts[i] ?? "retry";
            if (verdict === "ack") m.ack();
            else if (verdict === "drop") m.term();
            else m.nak(REDELIVERY_DELAY_MS);
          });
        }
      })();
      return {
        async stop() {
          stopping = true;
          await messages.close();
          wake("puller");
          wake("handler");
          await Promise.all([pulling, handling]);
          // Taken from the server but never handled: another consumer may have them now.
          for (const m of queue.splice(0)) m.nak();
        },
        async pending() {
          const info = await jsm.consumers.info(stream.name, durable);
          return info.num_pending + info.num_ack_pending;
        },
      };
    },
    async close() {},
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
