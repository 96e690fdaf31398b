import { describe, expect, it } from "vitest";
import { AFTER_STREAMS_MS, streamGraceMs } from "./app.js";

describe("what a router's stop leaves its streams in flight", () => {
  it("is its bound less the time their usage takes to publish: 20 s by default, 120 s of the chart's 125", () => {
    expect(streamGraceMs()).toBe(20_000);
    expect(streamGraceMs(125_000)).toBe(120_000);
    expect(streamGraceMs(125_000) + AFTER_STREAMS_MS).toBe(125_000);
  });

  it("is nothing when the bound is shorter than that time: streams are cut at once and recorded", () => {
    expect(streamGraceMs(3_000)).toBe(0);
  });
});
