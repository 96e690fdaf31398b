import { describe, expect, it } from "vitest";
import { choose, FAILED_HOLD_MS, PREFERENCE_MS } from "./least-request.js";

// How calls spread over live replicas is tested through the channel (channel.test.ts).
describe("choose", () => {
  // A moment at which the first entry is the preferred one.
  const now = 1_000 * PREFERENCE_MS * 6;
  it("takes the fewest in flight, the preferred one of equals", () => {
    const r = [
      { id: 1, inFlight: 2, failedAt: 0 },
      { id: 2, inFlight: 1, failedAt: 0 },
      { id: 3, inFlight: 1, failedAt: 0 },
    ];
    expect(choose(r, now)?.id).toBe(2);
    expect(choose([r[1]!, r[2]!], now)?.id).toBe(2);
    expect(choose([], now)).toBeUndefined();
  });

  it("moves the preference to the next replica every PREFERENCE_MS, round the list", () => {
    const r = [1, 2, 3].map((id) => ({ id, inFlight: 0, failedAt: 0 }));
    const at = (k: number) => choose(r, now + k * PREFERENCE_MS + 1)?.id;
    expect([at(0), at(1), at(2), at(3)]).toEqual([1, 2, 3, 1]);
    // Busy beats preferred.
    r[1]!.inFlight = 1;
    expect(at(1)).toBe(3);
  });

  it("passes over a replica that failed within the hold, unless none other is ready", () => {
    const failed = { id: 1, inFlight: 0, failedAt: now - 10 };
    const busy = { id: 2, inFlight: 5, failedAt: 0 };
    expect(choose([failed, busy], now)?.id).toBe(2);
    expect(choose([failed], now)?.id).toBe(1);
    expect(choose([failed, busy], now + FAILED_HOLD_MS)?.id).toBe(1);
  });
});
