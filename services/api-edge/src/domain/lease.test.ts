import { describe, expect, it } from "vitest";
import { EdgeLease, nextLeaseSize } from "./lease.js";

const NOW = 1_000_000;

describe("EdgeLease", () => {
  it("admits while the quote fits what is left, and gives back the rest of each quote once its cost is known", () => {
    const lease = new EdgeLease({ budget: 100n, usableUntilMs: NOW + 1_000 });
    const a = lease.admit({ quote: 40n, tokens: 0 }, NOW)!;
    const b = lease.admit({ quote: 40n, tokens: 0 }, NOW)!;
    expect(a.ticket).toBe(1);
    expect(b.ticket).toBe(2);
    // 20 left: a third request of 40 does not fit.
    expect(lease.admit({ quote: 40n, tokens: 0 }, NOW)).toBeUndefined();
    a.end({ cost: 15n });
    // Ending twice changes nothing.
    a.end("released");
    expect(lease.budgetLeftNow).toBe(45n);
    expect(lease.admit({ quote: 40n, tokens: 0 }, NOW)?.ticket).toBe(3);
  });

  it("returns with what is committed: exact costs, quotes still running or unsure, and the unsure tickets", () => {
    const lease = new EdgeLease({ budget: 1_000n, requests: 10, tokens: 500, usableUntilMs: NOW + 1_000 });
    const done = lease.admit({ quote: 100n, tokens: 50 }, NOW)!;
    const released = lease.admit({ quote: 100n, tokens: 50 }, NOW)!;
    const unsure = lease.admit({ quote: 70n, tokens: 50 }, NOW)!;
    const running = lease.admit({ quote: 30n, tokens: 50 }, NOW)!;
    done.end({ cost: 12n });
    released.end("released");
    unsure.end("unsure");
    expect(lease.inFlight).toBe(1);
    expect(lease.returned()).toEqual({
      committed: 12n + 70n + 30n,
      unusedRequests: 6,
      unusedTokens: 300,
      unsure: [{ ticket: 3, quote: 70n }],
    });
    let idle = false;
    lease.onIdle = () => {
      idle = true;
    };
    running.end({ cost: 30n });
    expect(idle).toBe(true);
  });

  it("admits nothing past its time or beyond its units", () => {
    const lease = new EdgeLease({ requests: 1, tokens: 100, usableUntilMs: NOW + 1_000 });
    expect(lease.admit({ tokens: 101 }, NOW)).toBeUndefined();
    expect(lease.admit({ tokens: 10 }, NOW + 1_000)).toBeUndefined();
    expect(lease.admit({ tokens: 10 }, NOW)).toBeDefined();
    expect(lease.admit({ tokens: 10 }, NOW)).toBeUndefined();
  });
});

describe("nextLeaseSize", () => {
  it("asks for twice the last lease's demand, between 4 and 1000", () => {
    expect(nextLeaseSize(undefined)).toBe(4);
    expect(nextLeaseSize(30)).toBe(60);
    expect(nextLeaseSize(900)).toBe(1_000);
  });
});
