import { afterEach, describe, expect, it } from "vitest";
import { type BusMessage, type BusSubscription, createMemoryBus, type EventBus } from "./bus.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Polls `check` until it holds, failing after `ms`. */
async function until(check: () => boolean | Promise<boolean>, ms = 3_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Lets the bus loop run for a while, to show that nothing more arrives. */
const settle = () => new Promise((r) => setTimeout(r, 50));

const text = (m: BusMessage) => decoder.decode(m.data);

describe("createMemoryBus", () => {
  let bus: EventBus;
  const subs: BusSubscription[] = [];

  afterEach(async () => {
    for (const s of subs.splice(0)) await s.stop();
    await bus?.close();
  });

  async function subscribe(
    durable: string,
    filter: string,
    handler: (m: BusMessage) => Promise<void>,
  ): Promise<BusSubscription> {
    const sub = await bus.subscribe(durable, filter, handler);
    subs.push(sub);
    return sub;
  }

  it("stores a message published twice with the same msgId once", async () => {
    bus = createMemoryBus();
    await bus.publish("usage.recorded", encoder.encode("first"), "req_1");
    await bus.publish("usage.recorded", encoder.encode("first again"), "req_1");
    await bus.publish("usage.recorded", encoder.encode("second"), "req_2");
    const got: BusMessage[] = [];
    const sub = await subscribe("metering", "usage.recorded", async (m) => {
      got.push(m);
    });
    await until(() => got.length >= 2);
    await settle();
    expect(got.map(text)).toEqual(["first", "second"]);
    expect(got.map((m) => m.msgId)).toEqual(["req_1", "req_2"]);
    expect(got.map((m) => m.deliveryCount)).toEqual([1, 1]);
    expect(await sub.pending()).toBe(0);
  });

  it("keeps its memory flat: handled messages are dropped, msgIds forgotten after the window", async () => {
    const memory = createMemoryBus(30);
    bus = memory;
    let single = 0;
    let batched = 0;
    await subscribe("one", "usage.>", async () => {
      single++;
    });
    subs.push(
      await memory.subscribeBatch("many", "usage.>", async (msgs) => {
        batched += msgs.length;
        return msgs.map(() => "ack" as const);
      }),
    );
    // Rounds of requests, each round past the duplicate window of the one before.
    const rounds = 5;
    const perRound = 2_000;
    for (let r = 0; r < rounds; r++) {
      for (let i = 0; i < perRound; i++) {
        await memory.publish("usage.recorded", encoder.encode("x"), `req_${r}_${i}`);
      }
      await until(() => single === (r + 1) * perRound && batched === (r + 1) * perRound);
      await new Promise((resolve) => setTimeout(resolve, 40));
    }
    // One more publish sweeps the msgIds of the last round and the messages every durable handled.
    await memory.publish("usage.recorded", encoder.encode("x"), "last");
    await until(() => single === rounds * perRound + 1 && batched === rounds * perRound + 1);
    await memory.publish("usage.recorded", encoder.encode("x"), "last");
    expect(memory.retained().msgIds).toBeLessThanOrEqual(1);
    expect(memory.retained().messages).toBeLessThan(perRound);
  });

  it("stores the same msgId again once the duplicate window has passed", async () => {
    bus = createMemoryBus(20);
    await bus.publish("s", encoder.encode("a"), "same");
    await new Promise((r) => setTimeout(r, 40));
    await bus.publish("s", encoder.encode("b"), "same");
    const got: string[] = [];
    await subscribe("d", "s", async (m) => {
      got.push(text(m));
    });
    await until(() => got.length >= 2);
    expect(got).toEqual(["a", "b"]);
  });

  it("delivers messages published before and after subscribing, in order", async () => {
    bus = createMemoryBus();
    await bus.publish("usage.recorded", encoder.encode("before"), "m1");
    const got: string[] = [];
    await subscribe("metering", "usage.recorded", async (m) => {
      got.push(text(m));
    });
    await bus.publish("usage.recorded", encoder.encode("after-1"), "m2");
    await bus.publish("usage.recorded", encoder.encode("after-2"), "m3");
    await until(() => got.length >= 3);
    expect(got).toEqual(["before", "after-1", "after-2"]);
  });

  it("gives each durable subscriber its own copy of every message", async () => {
    bus = createMemoryBus();
    const a: string[] = [];
    const b: string[] = [];
    await subscribe("one", "usage.recorded", async (m) => {
      a.push(text(m));
    });
    await subscribe("two", "usage.recorded", async (m) => {
      b.push(text(m));
    });
    await bus.publish("usage.recorded", encoder.encode("x"), "m1");
    await bus.publish("usage.recorded", encoder.encode("y"), "m2");
    await until(() => a.length >= 2 && b.length >= 2);
    expect(a).toEqual(["x", "y"]);
    expect(b).toEqual(["x", "y"]);
  });

  it("delivers again, with a higher delivery count, after a handler fails", async () => {
    bus = createMemoryBus();
    const deliveries: Array<{ body: string; msgId: string; count: number }> = [];
    let failed = false;
    const sub = await subscribe("metering", "usage.recorded", async (m) => {
      deliveries.push({ body: text(m), msgId: m.msgId, count: m.deliveryCount });
      if (!failed) {
        failed = true;
        throw new Error("store unavailable");
      }
    });
    await bus.publish("usage.recorded", encoder.encode("charge"), "req_9");
    await bus.publish("usage.recorded", encoder.encode("next"), "req_10");
    await until(() => deliveries.length >= 3, 4_000);
    expect(deliveries).toEqual([
      { body: "charge", msgId: "req_9", count: 1 },
      { body: "charge", msgId: "req_9", count: 2 },
      { body: "next", msgId: "req_10", count: 1 },
    ]);
    await until(async () => (await sub.pending()) === 0);
  });

  it("counts messages not yet consumed", async () => {
    bus = createMemoryBus();
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const handled: string[] = [];
    const sub = await subscribe("metering", "usage.recorded", async (m) => {
      await gate;
      handled.push(text(m));
    });
    expect(await sub.pending()).toBe(0);
    await bus.publish("usage.recorded", encoder.encode("1"), "m1");
    await bus.publish("usage.recorded", encoder.encode("2"), "m2");
    await bus.publish("usage.recorded", encoder.encode("3"), "m3");
    await settle();
    // The first is in the handler's hands but not yet done: all three are still pending.
    expect(await sub.pending()).toBe(3);
    expect(handled).toEqual([]);
    release();
    await until(() => handled.length === 3);
    expect(await sub.pending()).toBe(0);
  });

  it("skips messages on subjects outside the filter", async () => {
    bus = createMemoryBus();
    const exact: string[] = [];
    const wildcard: string[] = [];
    await subscribe("exact", "tollgate.usage.v1.recorded", async (m) => {
      exact.push(m.subject);
    });
    await subscribe("wildcard", "tollgate.usage.v1.>", async (m) => {
      wildcard.push(m.subject);
    });
    await bus.publish("tollgate.auth.v1.key-revoked", encoder.encode("k"), "m1");
    await bus.publish("tollgate.usage.v1.recorded", encoder.encode("u"), "m2");
    await bus.publish("tollgate.usage.v1.recordedx", encoder.encode("v"), "m3");
    await bus.publish("tollgate.usage.v1.corrected", encoder.encode("c"), "m4");
    await bus.publish("tollgate.usagex", encoder.encode("w"), "m5");
    await until(() => exact.length >= 1 && wildcard.length >= 3);
    await settle();
    expect(exact).toEqual(["tollgate.usage.v1.recorded"]);
    expect(wildcard).toEqual([
      "tollgate.usage.v1.recorded",
      "tollgate.usage.v1.recordedx",
      "tollgate.usage.v1.corrected",
    ]);
  });

  it("delivers nothing more after stop", async () => {
    bus = createMemoryBus();
    const got: string[] = [];
    const sub = await bus.subscribe("metering", "s", async (m) => {
      got.push(text(m));
    });
    await bus.publish("s", encoder.encode("a"), "m1");
    await until(() => got.length === 1);
    await sub.stop();
    await bus.publish("s", encoder.encode("b"), "m2");
    await settle();
    expect(got).toEqual(["a"]);
  });
});
