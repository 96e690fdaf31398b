import { AckPolicy, DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { type NatsConnection, nanos } from "@nats-io/transport-node";
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
    async close() {},
  };
}

/**
 * The in-memory bus for the all-in-one process without NATS: the same contract (dedupe by
 * msgId, at-least-once per durable, redelivery after a failed handler) inside one process.
 */
export function createMemoryBus(duplicateWindowMs = 120_000): EventBus {
  const log: Array<{ subject: string; data: Uint8Array; msgId: string }> = [];
  const seen = new Map<string, number>();
  const consumers = new Set<() => void>();
  let closed = false;

  return {
    async publish(subject, data, msgId) {
      const now = Date.now();
      const at = seen.get(msgId);
      if (at !== undefined && now - at < duplicateWindowMs) return;
      seen.set(msgId, now);
      log.push({ subject, data, msgId });
      for (const wake of consumers) wake();
    },
    async subscribe(_durable, filterSubject, handler) {
      const prefix = filterSubject.endsWith(">") ? filterSubject.slice(0, -1) : undefined;
      const matches = (s: string) => (prefix !== undefined ? s.startsWith(prefix) : s === filterSubject);
      let cursor = 0;
      let running = true;
      let wake: () => void = () => {};
      const wakeUp = () => wake();
      consumers.add(wakeUp);
      const loop = (async () => {
        while (running && !closed) {
          const next = log[cursor];
          if (!next) {
            await new Promise<void>((resolve) => {
              wake = resolve;
            });
            continue;
          }
          if (!matches(next.subject)) {
            cursor++;
            continue;
          }
          let deliveryCount = 1;
          for (;;) {
            try {
              await handler({ ...next, deliveryCount });
              break;
            } catch {
              deliveryCount++;
              await new Promise((r) => setTimeout(r, REDELIVERY_DELAY_MS));
              if (!running) return;
            }
          }
          cursor++;
        }
      })();
      return {
        async stop() {
          running = false;
          consumers.delete(wakeUp);
          wake();
          await loop;
        },
        async pending() {
          return log.length - cursor;
        },
      };
    },
    async close() {
      closed = true;
      for (const wake of consumers) wake();
    },
  };
}
