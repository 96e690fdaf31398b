import { describe, expect, it } from "vitest";
import { createMemoryIdempotencyStore } from "./memory-idempotency-store.js";

const response = { status: 200, headers: {}, body: Buffer.from("{}") };

describe("memory idempotency store", () => {
  it("drops records past their time to live although their keys are never sent again", async () => {
    let now = 0;
    const store = createMemoryIdempotencyStore(() => now);
    // 10 minutes of requests, each with its own key kept 2 minutes.
    for (let i = 0; i < 60_000; i++) {
      now = i * 10;
      expect((await store.begin(`key_${i}`, "fp", "a", 5_000)).kind).toBe("run");
      await store.complete(`key_${i}`, "fp", "a", response, 120_000);
    }
    // At most the last two minutes, plus one sweep interval.
    expect(store.retained().records).toBeLessThanOrEqual(18_001);
    expect((await store.begin("key_59999", "fp", "a", 5_000)).kind).toBe("replay");
  });
});
