import { describe, expect, it } from "vitest";
import { MeteringError } from "./errors.js";
import {
  bucketStart,
  bucketStarts,
  dimensionsKey,
  parseCost,
  parseDimensionsKey,
  resolveUsageQuery,
} from "./usage.js";

const at = (iso: string) => new Date(iso);
const DAY = 86_400_000;

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof MeteringError) return err.code;
    throw err;
  }
  return undefined;
}

describe("buckets", () => {
  it("start at UTC hour and day boundaries", () => {
    expect(bucketStart(at("2025-03-30T01:59:59.999Z"), "hour").toISOString()).toBe(
      "2025-03-30T01:00:00.000Z",
    );
    expect(bucketStart(at("2025-03-30T23:59:59.999Z"), "day").toISOString()).toBe("2025-03-30T00:00:00.000Z");
    expect(bucketStart(at("2025-03-31T00:00:00.000Z"), "day").toISOString()).toBe("2025-03-31T00:00:00.000Z");
  });

  it("cover every bucket overlapping [from, to)", () => {
    const hours = bucketStarts(at("2025-03-10T10:30:00Z"), at("2025-03-10T13:00:00Z"), "hour");
    expect(hours.map((d) => d.toISOString())).toEqual([
      "2025-03-10T10:00:00.000Z",
      "2025-03-10T11:00:00.000Z",
      "2025-03-10T12:00:00.000Z",
    ]);
    expect(bucketStarts(at("2025-03-10T10:00:00Z"), at("2025-03-10T10:00:00.001Z"), "day")).toHaveLength(1);
  });
});

describe("resolveUsageQuery", () => {
  const now = at("2025-03-10T12:34:56Z");

  it("defaults to the last 24 hours, hourly, not broken down by model", () => {
    const q = resolveUsageQuery({ filter: {} }, now);
    expect(q).toEqual({
      filter: {},
      from: at("2025-03-09T12:34:56Z"),
      to: now,
      granularity: "hour",
      byModel: false,
    });
  });

  it("takes 24 hours before `to` when only `to` is given", () => {
    const q = resolveUsageQuery({ filter: {}, to: at("2025-01-02T00:00:00Z"), granularity: "day" }, now);
    expect(q.from).toEqual(at("2025-01-01T00:00:00Z"));
  });

  it("rejects an empty or reversed range", () => {
    expect(codeOf(() => resolveUsageQuery({ filter: {}, from: now, to: now }, now))).toBe(
      "invalid_time_range",
    );
    expect(codeOf(() => resolveUsageQuery({ filter: {}, from: now }, at("2025-03-01T00:00:00Z")))).toBe(
      "invalid_time_range",
    );
  });

  it("allows 31 days of hours and 400 days of days, no more", () => {
    const to = now;
    const q = (days: number, granularity: "hour" | "day") => () =>
      resolveUsageQuery({ filter: {}, from: new Date(to.getTime() - days * DAY), to, granularity }, now);
    expect(codeOf(q(31, "hour"))).toBeUndefined();
    expect(codeOf(q(31.001, "hour"))).toBe("time_range_too_large");
    expect(codeOf(q(400, "day"))).toBeUndefined();
    expect(codeOf(q(400.001, "day"))).toBe("time_range_too_large");
  });

  it("tells a range too long for hours that days reach further", () => {
    const to = now;
    const from = new Date(to.getTime() - 60 * DAY);
    expect(() => resolveUsageQuery({ filter: {}, from, to, granularity: "hour" }, now)).toThrow(
      "granularity=hour spans at most 31 days; granularity=day spans up to 400: narrow from/to",
    );
  });
});

describe("parseCost", () => {
  it("reads decimal base units exactly", () => {
    expect(parseCost("0")).toBe(0n);
    expect(parseCost("9007199254740993")).toBe(9007199254740993n);
    expect(parseCost("9223372036854775807")).toBe(2n ** 63n - 1n);
  });

  it("refuses anything but a non-negative int64 integer", () => {
    for (const bad of ["", "-1", "1.5", "1e6", " 1", "0x10", "01", "9223372036854775808"]) {
      expect(
        codeOf(() => parseCost(bad)),
        bad,
      ).toBe("invalid_usage_event");
    }
  });
});

describe("dimensionsKey", () => {
  it("round-trips ids containing the separator", () => {
    const d = { accountId: "a|b", connectionId: "%7C", keyId: "", model: "org/model:tag" };
    expect(parseDimensionsKey(dimensionsKey(d))).toEqual(d);
    expect(dimensionsKey(d)).not.toBe(dimensionsKey({ ...d, accountId: "a", connectionId: "b|%7C" }));
  });
});
