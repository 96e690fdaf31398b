import { afterEach, describe, expect, it } from "vitest";
import {
  type BatchVerdict,
  type BusMessage,
  type BusSubscription,
  createMemoryBus,
  type EventBus,
} from "./bus.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const text = (m: BusMessage) => decoder.decode(m.data);

async function until(check: () => boolean | Promise<boolean>, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("createMemoryBus: batch subscriptions", () => {
  let bus: EventBus;
  const subs: BusSubscription[] = [];

  afterEach(async () => {
    for (const s of subs.splice(0)) await s.stop();
    await bus?.close();
  });

  it("hands over everything waiting as one batch, at most maxMessages, only matching subjects", async () => {
    bus = createMemoryBus();
    for (let i = 0; i < 5; i++) await bus.publish("usage.a", encoder.encode(`m${i}`), `id${i}`);
    await bus.publish("other", encoder.encode("x"), "other");
    await bus.publish("usage.b", encoder.encode("m5"), "id5");
    const batches: string[][] = [];
    const sub = await bus.subscribeBatch!(
      "d",
      "usage.>",
      async (msgs) => {
        batches.push(msgs.map(text));
        return msgs.map((): BatchVerdict => "ack");
      },
      { maxMessages: 4 },
    );
    subs.push(sub);
    await until(async () => (await sub.pending()) === 0);
    expect(batches).toEqual([
      ["m0", "m1", "m2", "m3"],
      ["m4", "m5"],
    ]);
  });

  it("delivers again only the messages whose verdict was retry, and never a dropped one", async () => {
    bus = createMemoryBus();
    for (const m of ["ok", "retry", "drop"]) await bus.publish("s", encoder.encode(m), m);
    const seen: Array<[string, number]> = [];
    let failures = 1;
    const sub = await bus.subscribeBatch!("d", "s", async (msgs) => {
      for (const m of msgs) seen.push([text(m), m.deliveryCount]);
      return msgs.map((m): BatchVerdict => {
        if (text(m) === "retry" && failures-- > 0) return "retry";
        return text(m) === "drop" ? "drop" : "ack";
      });
    });
    subs.push(sub);
    await until(async () => (await sub.pending()) === 0);
    expect(seen).toEqual([
      ["ok", 1],
      ["retry", 1],
      ["drop", 1],
      ["retry", 2],
    ]);
  });

  it("delivers the whole batch again when the handler rejects", async () => {
    bus = createMemoryBus();
    await bus.publish("s", encoder.encode("a"), "a");
    await bus.publish("s", encoder.encode("b"), "b");
    const calls: string[][] = [];
    const sub = await bus.subscribeBatch!("d", "s", async (msgs) => {
      calls.push(msgs.map(text));
      if (calls.length === 1) throw new Error("store unavailable");
      return msgs.map((): BatchVerdict => "ack");
    });
    subs.push(sub);
    await until(async () => (await sub.pending()) === 0);
    expect(calls).toEqual([
      ["a", "b"],
      ["a", "b"],
    ]);
  });

  it("waits lingerMs for more messages to join a batch", async () => {
    bus = createMemoryBus();
    const batches: number[] = [];
    const sub = await bus.subscribeBatch!(
      "d",
      "s",
      async (msgs) => {
        batches.push(msgs.length);
        return msgs.map((): BatchVerdict => "ack");
      },
      { lingerMs: 100 },
    );
    subs.push(sub);
    await bus.publish("s", encoder.encode("a"), "a");
    await new Promise((r) => setTimeout(r, 20));
    await bus.publish("s", encoder.encode("b"), "b");
    await until(async () => (await sub.pending()) === 0);
    expect(batches).toEqual([2]);
  });
});
