import { describe, expect, it } from "vitest";
import { ExpiringIds } from "./memory-window.js";

describe("ExpiringIds", () => {
  it("remembers an id for exactly its time to live, then takes it again", () => {
    const ids = new ExpiringIds(1_000);
    expect(ids.add("a", 0)).toBe(true);
    expect(ids.add("a", 999)).toBe(false);
    expect(ids.has("a", 999)).toBe(true);
    expect(ids.has("a", 1_000)).toBe(false);
    expect(ids.add("a", 1_000)).toBe(true);
    // Its second life counts from the second add.
    expect(ids.has("a", 1_999)).toBe(true);
    expect(ids.has("a", 2_000)).toBe(false);
  });

  it("forgets only what expired, across its compactions, and stays as large as one window", () => {
    const ids = new ExpiringIds(100);
    // 10 ids a millisecond for 10 000 ms: a hundred windows.
    for (let t = 0; t < 10_000; t++) {
      for (let k = 0; k < 10; k++) expect(ids.add(`${t}:${k}`, t)).toBe(true);
      expect(ids.size).toBeLessThanOrEqual(1_010);
    }
    expect(ids.has("9900:0", 9_999)).toBe(true);
    expect(ids.has("9899:9", 9_999)).toBe(false);
    expect(ids.size).toBe(1_000);
  });

  it("remembers longer, never shorter, when the clock goes back", () => {
    const ids = new ExpiringIds(1_000);
    ids.add("early", 5_000);
    ids.add("late", 4_000);
    // "late" expires at 5 000 but waits behind "early" (6 000): kept longer.
    expect(ids.has("late", 5_500)).toBe(true);
    expect(ids.has("early", 5_999)).toBe(true);
    expect(ids.has("early", 6_000)).toBe(false);
    expect(ids.has("late", 6_000)).toBe(false);
  });
});
