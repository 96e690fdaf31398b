import { randomUUID } from "node:crypto";
import { expect, it } from "vitest";
import type { UsageStore } from "../src/domain/ports.js";
import type { UsageEvent } from "../src/domain/usage.js";

/** A valid event; every call gets a fresh event id. */
export function usageEvent(overrides: Partial<UsageEvent> = {}): UsageEvent {
  return {
    eventId: randomUUID(),
    requestId: `req_${randomUUID()}`,
    occurredAt: new Date("2025-03-10T10:15:00Z"),
    accountId: "acct_a",
    connectionId: "conn_a",
    keyId: "key_a",
    model: "small",
    inputTokens: 100,
    outputTokens: 20,
    reasoningTokens: 5,
    cost: 1_250n,
    ...overrides,
  };
}

const at = (iso: string) => new Date(iso);

/**
 * Behaviour every UsageStore must show; the memory store runs it as a unit test and the
 * Redis store against a real Redis, so the two cannot drift apart.
 */
export function usageStoreContract(makeStore: () => UsageStore | Promise<UsageStore>): void {
  it("applies an event once however often it arrives", async () => {
    const store = await makeStore();
    const e = usageEvent();
    expect(await store.record(e)).toBe("recorded");
    expect(await store.record(e)).toBe("duplicate");
    expect(await store.record({ ...e, requestId: "req_other", cost: 999n })).toBe("duplicate");
    const r = await store.query({}, at("2025-03-10T00:00:00Z"), at("2025-03-11T00:00:00Z"), "hour");
    expect(r.totals).toEqual({
      requests: 1n,
      inputTokens: 100n,
      outputTokens: 20n,
      reasoningTokens: 5n,
      cost: 1_250n,
    });
  });

  it("applies concurrent copies of one event exactly once", async () => {
    const store = await makeStore();
    const e = usageEvent();
    const outcomes = await Promise.all(Array.from({ length: 20 }, () => store.record(e)));
    expect(outcomes.filter((o) => o === "recorded")).toHaveLength(1);
    const r = await store.query({}, at("2025-03-10T00:00:00Z"), at("2025-03-11T00:00:00Z"), "day");
    expect(r.totals.requests).toBe(1n);
  });

  it("rolls events up into UTC hour and day buckets ordered by start", async () => {
    const store = await makeStore();
    await store.record(usageEvent({ occurredAt: at("2025-03-10T23:59:59.999Z"), cost: 1n }));
    await store.record(usageEvent({ occurredAt: at("2025-03-11T00:00:00Z"), cost: 2n }));
    await store.record(usageEvent({ occurredAt: at("2025-03-10T22:00:00Z"), cost: 4n }));
    await store.record(usageEvent({ occurredAt: at("2025-03-10T23:30:00Z"), cost: 8n }));

    const hours = await store.query({}, at("2025-03-10T00:00:00Z"), at("2025-03-12T00:00:00Z"), "hour");
    expect(hours.buckets.map((b) => [b.start.toISOString(), b.totals.cost, b.totals.requests])).toEqual([
      ["2025-03-10T22:00:00.000Z", 4n, 1n],
      ["2025-03-10T23:00:00.000Z", 9n, 2n],
      ["2025-03-11T00:00:00.000Z", 2n, 1n],
    ]);
    expect(hours.totals.cost).toBe(15n);

    const days = await store.query({}, at("2025-03-01T00:00:00Z"), at("2025-04-01T00:00:00Z"), "day");
    expect(days.buckets.map((b) => [b.start.toISOString(), b.totals.cost])).toEqual([
      ["2025-03-10T00:00:00.000Z", 13n],
      ["2025-03-11T00:00:00.000Z", 2n],
    ]);
    expect(days.totals).toEqual(hours.totals);
  });

  it("counts the buckets overlapping [from, to) and nothing outside", async () => {
    const store = await makeStore();
    await store.record(usageEvent({ occurredAt: at("2025-03-10T09:59:00Z"), cost: 1n }));
    await store.record(usageEvent({ occurredAt: at("2025-03-10T10:05:00Z"), cost: 10n }));
    await store.record(usageEvent({ occurredAt: at("2025-03-10T11:00:00Z"), cost: 100n }));
    // 10:30 lies inside the 10:00 bucket, so that bucket counts; 11:00 is excluded by `to`.
    const r = await store.query({}, at("2025-03-10T10:30:00Z"), at("2025-03-10T11:00:00Z"), "hour");
    expect(r.totals.cost).toBe(10n);
    expect(r.buckets).toHaveLength(1);
  });

  it("filters by each dimension, an empty filter matching everything", async () => {
    const store = await makeStore();
    await store.record(
      usageEvent({ accountId: "a1", connectionId: "c1", keyId: "k1", model: "m1", cost: 1n }),
    );
    await store.record(
      usageEvent({ accountId: "a1", connectionId: "c1", keyId: "k2", model: "m2", cost: 10n }),
    );
    await store.record(
      usageEvent({ accountId: "a1", connectionId: "c2", keyId: "k3", model: "m1", cost: 100n }),
    );
    await store.record(
      usageEvent({ accountId: "a2", connectionId: "c3", keyId: "k4", model: "m1", cost: 1000n }),
    );
    // Separators inside ids must not let one combination pass for another.
    await store.record(
      usageEvent({ accountId: "a1|c1", connectionId: "k1", keyId: "", model: "m1", cost: 10000n }),
    );
    const from = at("2025-03-10T00:00:00Z");
    const to = at("2025-03-11T00:00:00Z");
    const cost = async (f: Parameters<UsageStore["query"]>[0]) =>
      (await store.query(f, from, to, "hour")).totals.cost;
    expect(await cost({})).toBe(11111n);
    expect(await cost({ accountId: "", connectionId: "", keyId: "", model: "" })).toBe(11111n);
    expect(await cost({ accountId: "a1" })).toBe(111n);
    expect(await cost({ accountId: "a1", connectionId: "c1" })).toBe(11n);
    expect(await cost({ keyId: "k2" })).toBe(10n);
    expect(await cost({ model: "m1" })).toBe(11101n);
    expect(await cost({ accountId: "a1", model: "m1" })).toBe(101n);
    expect(await cost({ accountId: "nobody" })).toBe(0n);
    expect((await store.query({ accountId: "nobody" }, from, to, "hour")).buckets).toEqual([]);
  });

  it("breaks a report down by model and period, the totals unchanged", async () => {
    const store = await makeStore();
    const seen = [
      { at: "2025-03-10T10:15:00Z", model: "m2", cost: 1n },
      { at: "2025-03-10T11:15:00Z", model: "m1", cost: 10n },
      { at: "2025-03-10T23:59:59Z", model: "m2", cost: 100n },
      { at: "2025-03-11T00:00:00Z", model: "m1", cost: 1000n },
      { at: "2025-03-11T05:00:00Z", model: "m1", cost: 10000n },
    ];
    for (const e of seen)
      await store.record(usageEvent({ occurredAt: at(e.at), model: e.model, cost: e.cost }));
    // Another account's usage of the same models stays out of a filtered report.
    await store.record(usageEvent({ accountId: "acct_b", model: "m1", cost: 7n }));
    const r = await store.query(
      { accountId: "acct_a" },
      at("2025-03-10T00:00:00Z"),
      at("2025-03-12T00:00:00Z"),
      "day",
      true,
    );
    expect(
      r.buckets.map((b) => [b.start.toISOString().slice(0, 10), b.model, b.totals.cost, b.totals.requests]),
    ).toEqual([
      ["2025-03-10", "m1", 10n, 1n],
      ["2025-03-10", "m2", 101n, 2n],
      ["2025-03-11", "m1", 11000n, 2n],
    ]);
    expect(r.totals.cost).toBe(11111n);
    const plain = await store.query(
      { accountId: "acct_a" },
      at("2025-03-10T00:00:00Z"),
      at("2025-03-12T00:00:00Z"),
      "day",
    );
    expect(plain.totals).toEqual(r.totals);
    expect(plain.buckets.map((b) => [b.model, b.totals.cost])).toEqual([
      [undefined, 111n],
      [undefined, 11000n],
    ]);
  });

  it("applies a batch across accounts and buckets, each event once, a repeat within it a duplicate", async () => {
    const store = await makeStore();
    const seen = usageEvent({ accountId: "a2", cost: 1n });
    expect(await store.record(seen)).toBe("recorded");
    const batch = [
      usageEvent({ accountId: "a1", cost: 10n }),
      usageEvent({ accountId: "a2", cost: 100n, occurredAt: at("2025-03-10T11:59:59Z") }),
      seen,
      usageEvent({ accountId: "a1", cost: 1_000n, occurredAt: at("2025-03-11T00:00:00Z") }),
      usageEvent({ accountId: "a3", cost: 2n ** 62n }),
    ];
    const repeat = { ...batch[0]!, requestId: "req_again" };
    expect(await store.recordMany([...batch, repeat])).toEqual([
      "recorded",
      "recorded",
      "duplicate",
      "recorded",
      "recorded",
      "duplicate",
    ]);
    // Delivered again as a whole: nothing changes.
    expect(await store.recordMany(batch)).toEqual(batch.map(() => "duplicate"));
    const from = at("2025-03-10T00:00:00Z");
    const to = at("2025-03-12T00:00:00Z");
    const day = await store.query({}, from, to, "day");
    expect(day.totals).toEqual({
      requests: 5n,
      inputTokens: 500n,
      outputTokens: 100n,
      reasoningTokens: 25n,
      cost: 1n + 10n + 100n + 1_000n + 2n ** 62n,
    });
    expect(day.buckets.map((b) => b.totals.cost)).toEqual([1n + 10n + 100n + 2n ** 62n, 1_000n]);
    expect((await store.query({ accountId: "a1" }, from, to, "hour")).totals.cost).toBe(1_010n);
    expect(
      (await store.query({ accountId: "a2" }, from, to, "hour")).buckets.map((b) => b.totals.cost),
    ).toEqual([1n, 100n]);
    expect(await store.recordMany([])).toEqual([]);
  });

  it("keeps costs and sums exact beyond 2^53", async () => {
    const store = await makeStore();
    const big = 2n ** 60n + 1n;
    await store.record(usageEvent({ cost: big }));
    await store.record(usageEvent({ cost: 3n }));
    const r = await store.query({}, at("2025-03-10T00:00:00Z"), at("2025-03-11T00:00:00Z"), "day");
    expect(r.totals.cost).toBe(big + 3n);
    expect(r.totals.requests).toBe(2n);
  });
}
