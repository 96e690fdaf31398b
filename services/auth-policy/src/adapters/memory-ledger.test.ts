import { describe, expect, it } from "vitest";
import { ledgerContract } from "../../test/ledger-contract.js";
import { rateLimiterContract } from "../../test/rate-limiter-contract.js";
import { type BudgetCheck, newReservationId } from "../domain/budget.js";
import { createMemoryLedger } from "./memory-ledger.js";

describe("memory ledger: rate limits", () => {
  rateLimiterContract(() => createMemoryLedger());
});

describe("memory ledger: budgets", () => {
  ledgerContract((opts) => createMemoryLedger(opts));
});

describe("memory ledger: memory under sustained load", () => {
  const T0 = Date.UTC(2025, 0, 15);
  const HOLD_MS = 1_000;
  const WINDOW_MS = 60_000;
  const budget: BudgetCheck = {
    id: "{acct}:connection:c1:month:2025-01",
    scope: "connection",
    limit: 10n ** 18n,
    periodEndMs: T0 + 86_400_000,
  };

  it("keeps only live holds: settled and expired ones are dropped, the budget stays exact", async () => {
    const expired: number[] = [];
    const l = createMemoryLedger({
      holdMs: HOLD_MS,
      settlementWindowMs: WINDOW_MS,
      onHoldsExpired: (n) => expired.push(n),
    });
    // 20 000 requests, 10 a millisecond: every other one settled at once, the rest never.
    let spent = 0n;
    for (let i = 0; i < 20_000; i++) {
      const now = new Date(T0 + Math.floor(i / 10));
      const id = newReservationId("acct");
      const a = await l.admit([], { hold: { reservationId: id, amount: 7n, budgets: [budget] } }, now);
      expect(a.admitted).toBe(true);
      if (i % 2 === 0) {
        expect((await l.settle(id, 3n, `evt_${i}`, now)).outcome).toBe("settled");
        spent += 3n;
      }
    }
    // Only the unsettled holds of the last hold period are still live.
    expect(l.retained().holds).toBeLessThanOrEqual((HOLD_MS * 10) / 2 + 10);
    const end = T0 + 2_000 + HOLD_MS;
    const seen = await l.admit([], { peek: [budget] }, new Date(end));
    expect(seen.budgets[0]).toEqual({ spent, held: 0n });
    expect(l.retained().holds).toBe(0);
    expect(expired.reduce((a, b) => a + b, 0)).toBe(10_000);
    // Past the settlement window, the reservations are forgotten too.
    await l.admit([], { peek: [budget] }, new Date(end + WINDOW_MS + 60_001));
    expect(l.retained().reservations).toBe(0);
  });
});
