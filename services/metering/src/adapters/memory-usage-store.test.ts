import { heapBytesPerItem } from "@tollgate/testkit/heap";
import { describe, expect, it } from "vitest";
import { usageEvent, usageStoreContract } from "../../test/usage-store-contract.js";
import { createMemoryUsageStore } from "./memory-usage-store.js";

describe("memory usage store", () => {
  usageStoreContract(() => createMemoryUsageStore());

  it("forgets applied event ids only after their time to live", async () => {
    let now = 0;
    const store = createMemoryUsageStore({ eventTtlMs: 1_000, now: () => now });
    const e = usageEvent();
    expect(await store.record(e)).toBe("recorded");
    now = 999;
    expect(await store.record(e)).toBe("duplicate");
    now = 1_000;
    expect(await store.record(e)).toBe("recorded");
  });

  it("keeps its memory flat: event ids past the dedupe window are forgotten as new ones arrive", async () => {
    let now = 0;
    const store = createMemoryUsageStore({ eventTtlMs: 1_000, now: () => now });
    // 50 000 events, 10 a millisecond: five dedupe windows.
    for (let i = 0; i < 50_000; i++) {
      now = Math.floor(i / 10);
      expect(await store.record(usageEvent({ eventId: `evt_${i}` }))).toBe("recorded");
    }
    expect(store.retained().eventIds).toBeLessThanOrEqual(10_000);
    // A repeat inside the window still counts once.
    expect(await store.record(usageEvent({ eventId: "evt_49999" }))).toBe("duplicate");
  });

  it("holds an event id of its dedupe window in under 80 bytes besides the id itself", async () => {
    // 100 000 events in one window: what a busy all-in-one holds for the default seven days.
    const events = Array.from({ length: 100_000 }, (_, i) => usageEvent({ eventId: `evt_${i}` }));
    const store = createMemoryUsageStore();
    const perId = await heapBytesPerItem(events.length, async () => {
      await store.recordMany(events);
    });
    expect(store.retained().eventIds).toBe(events.length);
    expect(perId).toBeLessThan(80);
  });
});
