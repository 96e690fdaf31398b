import { describe, expect, it } from "vitest";
import { stepsDeadline, stopDeadline, withinDeadline } from "./shutdown.js";

describe("a stop's deadline", () => {
  it("counts down from when it is made and never below zero", () => {
    let now = 1_000;
    const d = stopDeadline(500, () => now);
    expect(d.remainingMs()).toBe(500);
    now = 1_300;
    expect(d.remainingMs()).toBe(200);
    now = 9_000;
    expect(d.remainingMs()).toBe(0);
  });

  it("keeps back what follows the steps: 1 s of a long bound, a fifth of a short one", () => {
    const now = () => 0;
    expect(stepsDeadline(25_000, now).remainingMs()).toBe(24_000);
    expect(stepsDeadline(125_000, now).remainingMs()).toBe(124_000);
    expect(stepsDeadline(1_000, now).remainingMs()).toBe(800);
    expect(stepsDeadline(3_000, now).remainingMs()).toBe(2_400);
  });

  it("caps a step's own wait at what is left, and leaves it alone without a deadline", () => {
    let now = 0;
    const d = stopDeadline(4_000, () => now);
    expect(withinDeadline(10_000, d)).toBe(4_000);
    expect(withinDeadline(1_000, d)).toBe(1_000);
    now = 5_000;
    expect(withinDeadline(10_000, d)).toBe(0);
    expect(withinDeadline(10_000, undefined)).toBe(10_000);
  });
});
