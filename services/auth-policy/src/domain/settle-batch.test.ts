import { describe, expect, it } from "vitest";
import { settleBatchContract } from "../../test/settle-batch-contract.js";
import { createMemoryLedger } from "../adapters/memory-ledger.js";
import { newReservationId, settleReservations } from "./budget.js";
import type { Ledger } from "./ports.js";

describe("settleReservations on the memory ledger (settle() once per item)", () => {
  settleBatchContract((opts) => createMemoryLedger(opts));
});

describe("settleReservations", () => {
  it("answers a failed item in its place and still settles the others", async () => {
    const calls: string[] = [];
    const ledger: Pick<Ledger, "settle"> = {
      async settle(reservationId, cost) {
        calls.push(reservationId);
        if (reservationId.startsWith("rsv_BBBB")) throw new Error("store unavailable");
        return { outcome: "settled", cost };
      },
    };
    const a = newReservationId("a").replace(/^rsv_..../, "rsv_AAAA");
    const b = newReservationId("b").replace(/^rsv_..../, "rsv_BBBB");
    const c = newReservationId("c").replace(/^rsv_..../, "rsv_CCCC");
    const results = await settleReservations(ledger, [
      { reservationId: a, cost: 1n, eventId: "1" },
      { reservationId: b, cost: 2n, eventId: "2" },
      { reservationId: c, cost: 3n, eventId: "3" },
    ]);
    expect(calls).toEqual([a, b, c]);
    expect(results[0]).toEqual({ outcome: "settled", cost: 1n });
    expect(results[1]).toBeInstanceOf(Error);
    expect(results[2]).toEqual({ outcome: "settled", cost: 3n });
  });

  it("hands the whole batch to a ledger that settles many at once", async () => {
    const batches: number[] = [];
    const ledger: Pick<Ledger, "settle" | "settleMany"> = {
      settle: async () => {
        throw new Error("settle() must not be called one by one");
      },
      async settleMany(items) {
        batches.push(items.length);
        return items.map((i) => ({ outcome: "already_settled" as const, cost: i.cost }));
      },
    };
    const items = [1n, 2n, 3n].map((cost) => ({ reservationId: newReservationId("a"), cost, eventId: "e" }));
    const results = await settleReservations(ledger, [
      ...items,
      { reservationId: "", cost: 1n, eventId: "x" },
    ]);
    expect(batches).toEqual([3]);
    expect(results.slice(0, 3)).toEqual(items.map((i) => ({ outcome: "already_settled", cost: i.cost })));
    expect(results[3]).toMatchObject({ code: "invalid_argument" });
  });
});
