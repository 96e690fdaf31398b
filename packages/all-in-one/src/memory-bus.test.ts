import { createMemoryBus } from "@tollgate/kit/bus";
import { heapBytesPerItem } from "@tollgate/testkit/heap";
import { describe, expect, it } from "vitest";

// The all-in-one's usage bus under sustained load: every msgId of the duplicate window (two
// minutes, as JetStream's) stays remembered, about 200 000 of them at the bench's rate.
describe("the all-in-one's memory bus", () => {
  it("holds a msgId of its duplicate window in under 80 bytes besides the id itself", async () => {
    const bus = createMemoryBus();
    const ids = Array.from({ length: 100_000 }, (_, i) => `evt_${i}`);
    const data = new TextEncoder().encode("{}");
    let handled = 0;
    const sub = await bus.subscribeBatch("metering", "usage.>", async (batch) => {
      handled += batch.length;
      return batch.map(() => "ack" as const);
    });
    const perId = await heapBytesPerItem(ids.length, async () => {
      for (const id of ids) await bus.publish("usage.recorded", data, id);
      while (handled < ids.length) await new Promise((r) => setTimeout(r, 5));
    });
    // Every message handled and dropped; every msgId still deduplicates.
    expect(bus.retained()).toEqual({ messages: 0, msgIds: ids.length });
    await bus.publish("usage.recorded", data, ids[0]!);
    expect(await sub.pending()).toBe(0);
    expect(perId).toBeLessThan(80);
    await sub.stop();
    await bus.close();
  });
});
