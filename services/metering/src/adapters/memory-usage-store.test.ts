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
});
