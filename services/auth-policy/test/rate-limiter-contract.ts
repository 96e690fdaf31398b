// The behaviour every RateLimiter must show; run against memory (unit) and Redis (integration).
import { expect, it } from "vitest";
import type { RateLimiter, RateWindow } from "../src/domain/ports.js";
import { windowStates } from "../src/domain/rate-limit.js";

/** A limiter on the caller's clock, fresh for each test. */
export type LimiterFactory = () => Promise<RateLimiter> | RateLimiter;

// On a bucket boundary, so expected retry times are exact.
const T0 = Date.UTC(2025, 5, 1, 12, 0, 0);
const at = (ms: number) => new Date(T0 + ms);

const requests = (id: string, limit: number): RateWindow => ({
  id: `{acct}:${id}:requests`,
  scope: "key",
  unit: "requests",
  limit,
  cost: 1,
});
const tokens = (id: string, limit: number, cost: number): RateWindow => ({
  id: `{acct}:${id}:tokens`,
  scope: "connection",
  unit: "tokens",
  limit,
  cost,
});

export function rateLimiterContract(make: LimiterFactory): void {
  it("admits up to the limit and refuses the excess, with the time until a slot frees up", async () => {
    const limiter = await make();
    const w = [requests("a", 3)];
    for (let i = 0; i < 3; i++) expect((await limiter.consume(w, at(i * 1_000))).admitted).toBe(true);
    const refused = await limiter.consume(w, at(2_500));
    expect(refused.admitted).toBe(false);
    // The first unit was counted in second 0 and leaves the window when second 61 begins.
    expect(refused.counts[0]).toEqual({
      used: 3,
      newestBucket: T0 / 1_000 + 2,
      retryAfterMs: 61_000 - 2_500,
    });
    const [state] = windowStates(w, refused);
    expect(state?.remaining).toBe(0);
    expect(state?.resetMs).toBe(63_000 - 2_500);
  });

  it("never admits more than the limit in any 60 s, and frees units 60 to 61 s after use", async () => {
    const limiter = await make();
    const w = [requests("b", 2)];
    expect((await limiter.consume(w, at(0))).admitted).toBe(true);
    expect((await limiter.consume(w, at(30_000))).admitted).toBe(true);
    expect((await limiter.consume(w, at(59_999))).admitted).toBe(false);
    expect((await limiter.consume(w, at(60_999))).admitted).toBe(false);
    // Second 61: the unit of second 0 is out, the one of second 30 is still in.
    expect((await limiter.consume(w, at(61_000))).admitted).toBe(true);
    expect((await limiter.consume(w, at(61_001))).admitted).toBe(false);
    expect((await limiter.consume(w, at(91_000))).admitted).toBe(true);
  });

  it("refuses when any window is full, and then counts nothing in the others", async () => {
    const limiter = await make();
    const roomy = requests("roomy", 10);
    const full = requests("full", 1);
    expect((await limiter.consume([full], at(0))).admitted).toBe(true);
    for (let i = 0; i < 5; i++) {
      const d = await limiter.consume([roomy, full], at(1_000 + i));
      expect(d.admitted).toBe(false);
      expect(d.counts[0]?.retryAfterMs).toBe(0);
      expect(d.counts[1]?.retryAfterMs).toBeGreaterThan(0);
    }
    // The five refusals consumed nothing from the roomy window.
    const d = await limiter.consume([roomy], at(2_000));
    expect(d.admitted).toBe(true);
    expect(d.counts[0]?.used).toBe(0);
  });

  it("counts tokens by cost and frees enough of the oldest buckets for a large request", async () => {
    const limiter = await make();
    expect((await limiter.consume([tokens("t", 1_000, 300)], at(0))).admitted).toBe(true);
    expect((await limiter.consume([tokens("t", 1_000, 300)], at(10_000))).admitted).toBe(true);
    expect((await limiter.consume([tokens("t", 1_000, 300)], at(20_000))).admitted).toBe(true);
    const refused = await limiter.consume([tokens("t", 1_000, 500)], at(30_000));
    expect(refused.admitted).toBe(false);
    // 900 used: 500 more fit once the 300 of second 10 are gone too (second 71).
    expect(refused.counts[0]).toMatchObject({ used: 900, retryAfterMs: 71_000 - 30_000 });
    // A smaller request still fits the 100 left.
    expect((await limiter.consume([tokens("t", 1_000, 100)], at(30_000))).admitted).toBe(true);
  });

  it("says never for a cost above the limit", async () => {
    const limiter = await make();
    const d = await limiter.consume([tokens("huge", 100, 101)], at(0));
    expect(d.admitted).toBe(false);
    expect(d.counts[0]?.retryAfterMs).toBe(-1);
  });

  it("keeps windows apart by id and admits a zero cost without counting it", async () => {
    const limiter = await make();
    expect((await limiter.consume([requests("x", 1)], at(0))).admitted).toBe(true);
    expect((await limiter.consume([requests("y", 1)], at(0))).admitted).toBe(true);
    const zero = await limiter.consume([tokens("z", 1, 0), tokens("z", 1, 0)], at(0));
    expect(zero.admitted).toBe(true);
    expect((await limiter.consume([tokens("z", 1, 1)], at(0))).admitted).toBe(true);
  });

  it("reports the clock it counted on", async () => {
    const limiter = await make();
    expect((await limiter.consume([requests("clock", 5)], at(1_234))).nowMs).toBe(T0 + 1_234);
  });
}
