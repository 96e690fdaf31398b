import { type NatsFixture, uniqueNamespace, useNats } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { type BatchVerdict, type BusMessage, createJetStreamBus, type EventBus } from "../src/bus.js";
import { connectNats, drainNats, type NatsConnection } from "../src/nats.js";

const WAIT = { timeout: 10_000, interval: 20 };
const text = (m: BusMessage) => new TextDecoder().decode(m.data);
const bytes = (s: string) => new TextEncoder().encode(s);

let nats: NatsFixture;
let nc: NatsConnection;
const streams: string[] = [];

beforeAll(async () => {
  nats = await useNats();
  nc = await connectNats(nats.url, "kit-bus-int-test");
});

afterAll(async () => {
  for (const name of streams) await nc.request(`$JS.API.STREAM.DELETE.${name}`).catch(() => undefined);
  await drainNats(nc);
  await nats.stop();
});

async function bus(): Promise<{ bus: EventBus; subject: string; name: string }> {
  const ns = uniqueNamespace("kitbus");
  const name = `KIT_${ns}`;
  streams.push(name);
  return {
    bus: await createJetStreamBus(nc, { name, subjects: [`${ns}.>`], storage: "memory" }),
    subject: `${ns}.events`,
    name,
  };
}

async function stored(name: string): Promise<number> {
  const info = await nc.request(`$JS.API.STREAM.INFO.${name}`);
  return info.json<{ state: { messages: number } }>().state.messages;
}

describe("the JetStream bus", () => {
  it("answers a publish once it is stored, and stores a message published twice under one id once", async () => {
    const { bus: b, subject, name } = await bus();
    await b.publish(subject, bytes("a"), "id-1");
    expect(await stored(name)).toBe(1);
    await b.publish(subject, bytes("a"), "id-1");
    await Promise.all([b.publish(subject, bytes("b"), "id-2"), b.publish(subject, bytes("c"), "id-3")]);
    expect(await stored(name)).toBe(3);
  });

  it("fails a publish no stream takes, so its caller can retry", async () => {
    const { bus: b } = await bus();
    await expect(b.publish("kit.nothing.listens", bytes("x"), "id-x")).rejects.toThrow("no responders");
  });

  it("fails an unanswered publish after the shorter wait it asks for, not the bus's own 5 s", async () => {
    const { bus: b, name } = await bus();
    // Outside the stream, with a subscriber that never answers: no "no responders" status, no ack.
    const silent = nc.subscribe(`silent.${name}`);
    try {
      const started = Date.now();
      await expect(b.publish(`silent.${name}`, bytes("x"), "id-silent", 300)).rejects.toThrow("timed out");
      // Within the sweep's 250 ms of the asked-for wait.
      expect(Date.now() - started).toBeGreaterThanOrEqual(300);
      expect(Date.now() - started).toBeLessThan(1_500);
    } finally {
      silent.unsubscribe();
    }
  });

  it("hands over what was stored during the linger as one batch, in order", async () => {
    const { bus: b, subject } = await bus();
    const batches: string[][] = [];
    const sub = await b.subscribeBatch!(
      "d",
      subject,
      async (msgs) => {
        batches.push(msgs.map(text));
        return msgs.map(() => "ack");
      },
      { lingerMs: 300 },
    );
    try {
      for (let i = 0; i < 20; i++) await b.publish(subject, bytes(`m${i}`), `m${i}`);
      await vi.waitFor(async () => expect(await sub.pending()).toBe(0), WAIT);
      expect(batches.flat()).toEqual(Array.from({ length: 20 }, (_, i) => `m${i}`));
      // Published one at a time within the linger: one batch (two if the first came alone), not twenty.
      expect(batches.length).toBeLessThanOrEqual(2);
    } finally {
      await sub.stop();
    }
  });

  it("delivers again only a message whose verdict was retry, with a higher delivery count", async () => {
    const { bus: b, subject } = await bus();
    const seen: Array<[string, number]> = [];
    const verdict = (m: BusMessage): BatchVerdict => {
      if (text(m) === "drop") return "drop";
      return text(m) === "retry" && m.deliveryCount === 1 ? "retry" : "ack";
    };
    const sub = await b.subscribeBatch!("d", subject, async (msgs) => {
      for (const m of msgs) seen.push([text(m), m.deliveryCount]);
      return msgs.map(verdict);
    });
    try {
      await b.publish(subject, bytes("ok"), "ok");
      await b.publish(subject, bytes("retry"), "retry");
      await b.publish(subject, bytes("drop"), "drop");
      await vi.waitFor(() => expect(seen).toContainEqual(["retry", 2]), WAIT);
      await vi.waitFor(async () => expect(await sub.pending()).toBe(0), WAIT);
      expect(seen.filter(([t]) => t === "ok")).toEqual([["ok", 1]]);
      expect(seen.filter(([t]) => t === "drop")).toEqual([["drop", 1]]);
      expect(seen.filter(([t]) => t === "retry")).toEqual([
        ["retry", 1],
        ["retry", 2],
      ]);
    } finally {
      await sub.stop();
    }
  });

  it("names a message published without an id by its stream sequence, the same on its redelivery", async () => {
    const { bus: b, subject } = await bus();
    const ids: Array<[string, number]> = [];
    const sub = await b.subscribeBatch!("n", subject, async (msgs) => {
      for (const m of msgs) ids.push([m.msgId, m.deliveryCount]);
      return msgs.map((m) => (m.deliveryCount === 1 ? "retry" : "ack"));
    });
    try {
      // A plain NATS publish (no Nats-Msg-Id), as a tool outside Tollgate would send it.
      nc.publish(subject, bytes("bare"));
      await vi.waitFor(() => expect(ids.map(([, n]) => n)).toEqual([1, 2]), WAIT);
      expect(ids[0]![0]).toMatch(/^[0-9]+$/);
      expect(ids[1]![0]).toBe(ids[0]![0]);
    } finally {
      await sub.stop();
    }
  });
});
