import { describe, expect, it } from "vitest";
import { costOf, type Prices, pricingSnapshotId, quoteOf } from "./pricing.js";

const mini: Prices = { inputPerMillion: 150_000n, outputPerMillion: 600_000n };

/** mulberry32: a small seeded PRNG so the property checks are reproducible. */
function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  /** An integer in [0, max]. */
  const int = (max: number) => Math.floor(next() * (max + 1));
  return { int };
}

describe("costOf", () => {
  it("charges one base unit for a fraction of a unit", () => {
    expect(costOf({ inputTokens: 1, outputTokens: 0 }, mini)).toBe(1n);
    expect(costOf({ inputTokens: 0, outputTokens: 1 }, mini)).toBe(1n);
  });

  it("charges nothing for no tokens", () => {
    expect(costOf({ inputTokens: 0, outputTokens: 0 }, mini)).toBe(0n);
  });

  it("rounds once, at the end, not per side", () => {
    // 0.15 + 0.6 = 0.75 units: one unit, not two.
    expect(costOf({ inputTokens: 1, outputTokens: 1 }, mini)).toBe(1n);
    // 4 * 0.15 + 1 * 0.6 = 1.2 units: two.
    expect(costOf({ inputTokens: 4, outputTokens: 1 }, mini)).toBe(2n);
  });

  it("is exact on whole units", () => {
    expect(costOf({ inputTokens: 1_000_000, outputTokens: 0 }, mini)).toBe(150_000n);
    expect(costOf({ inputTokens: 1_000_000, outputTokens: 2_000_000 }, mini)).toBe(1_350_000n);
    expect(costOf({ inputTokens: 20, outputTokens: 0 }, mini)).toBe(3n);
  });

  it("stays exact for counts and prices beyond float precision", () => {
    const prices: Prices = { inputPerMillion: 10n ** 24n + 7n, outputPerMillion: 3n * 10n ** 24n };
    const usage = { inputTokens: 4_294_967_295, outputTokens: 4_000_000_001 };
    const scaled = 4_294_967_295n * (10n ** 24n + 7n) + 4_000_000_001n * 3n * 10n ** 24n;
    const expected = (scaled + 999_999n) / 1_000_000n;
    const cost = costOf(usage, prices);
    expect(typeof cost).toBe("bigint");
    expect(cost).toBe(expected);
  });

  it("is free when the model is free", () => {
    expect(
      costOf({ inputTokens: 123_456, outputTokens: 789 }, { inputPerMillion: 0n, outputPerMillion: 0n }),
    ).toBe(0n);
  });
});

describe("quoteOf", () => {
  it("is never below the cost of a request that fits the body and the cap", () => {
    const r = prng(0x7011);
    for (let i = 0; i < 500; i++) {
      const prices: Prices = {
        inputPerMillion: BigInt(r.int(20_000_000)),
        outputPerMillion: BigInt(r.int(80_000_000)),
      };
      const bodyBytes = r.int(200_000);
      const messageCount = r.int(50);
      const cap = r.int(32_768);
      const usage = { inputTokens: r.int(bodyBytes), outputTokens: r.int(cap) };
      const quote = quoteOf(bodyBytes, messageCount, cap, prices);
      const cost = costOf(usage, prices);
      expect(quote >= cost, `case ${i}: quote ${quote} < cost ${cost}`).toBe(true);
      // The worst case the quote promises to cover: every byte a token, the whole cap used.
      expect(quote >= costOf({ inputTokens: bodyBytes, outputTokens: cap }, prices)).toBe(true);
    }
  });

  it("covers chat-template overhead beyond the body bytes", () => {
    // 10 messages of nearly empty body still owe template tokens.
    const expensive: Prices = { inputPerMillion: 1_000_000n, outputPerMillion: 0n };
    expect(quoteOf(2, 10, 0, expensive)).toBeGreaterThanOrEqual(2n + 8n * 10n);
  });

  it("grows with the output cap", () => {
    expect(quoteOf(100, 1, 4096, mini)).toBeGreaterThan(quoteOf(100, 1, 16, mini));
  });

  it("covers the cap once for every output sequence (n choices, prompts)", () => {
    const r = prng(0x5e9);
    for (let i = 0; i < 300; i++) {
      const prices: Prices = {
        inputPerMillion: BigInt(r.int(20_000_000)),
        outputPerMillion: BigInt(r.int(80_000_000)),
      };
      const bodyBytes = r.int(20_000);
      const cap = r.int(4_096);
      const sequences = 1 + r.int(128);
      const quote = quoteOf(bodyBytes, 1, cap, prices, sequences);
      const worst = costOf({ inputTokens: bodyBytes, outputTokens: cap * sequences }, prices);
      expect(quote >= worst, `case ${i}: quote ${quote} < worst ${worst}`).toBe(true);
    }
    expect(quoteOf(100, 1, 1_000, mini, 16)).toBeGreaterThan(quoteOf(100, 1, 1_000, mini) * 10n);
    // 0 sequences is read as one.
    expect(quoteOf(100, 1, 1_000, mini, 0)).toBe(quoteOf(100, 1, 1_000, mini));
  });
});

describe("pricingSnapshotId", () => {
  const models = [
    { id: "tollgate-mini", pricing: { inputPerMillion: 150_000n, outputPerMillion: 600_000n } },
    { id: "tollgate-pro", pricing: { inputPerMillion: 2_500_000n, outputPerMillion: 10_000_000n } },
    { id: "tollgate-reasoner", pricing: { inputPerMillion: 1_100_000n, outputPerMillion: 4_400_000n } },
  ];

  it("has a stable, short form", () => {
    const id = pricingSnapshotId(models);
    expect(id).toMatch(/^ps_[0-9a-f]{16}$/);
    expect(pricingSnapshotId(models)).toBe(id);
  });

  it("does not depend on model order", () => {
    const reversed = [...models].reverse();
    const rotated = [models[1]!, models[2]!, models[0]!];
    expect(pricingSnapshotId(reversed)).toBe(pricingSnapshotId(models));
    expect(pricingSnapshotId(rotated)).toBe(pricingSnapshotId(models));
  });

  it("changes when any one price changes", () => {
    const base = pricingSnapshotId(models);
    const input = models.map((m, i) =>
      i === 2 ? { ...m, pricing: { ...m.pricing, inputPerMillion: m.pricing.inputPerMillion + 1n } } : m,
    );
    const output = models.map((m, i) =>
      i === 0 ? { ...m, pricing: { ...m.pricing, outputPerMillion: m.pricing.outputPerMillion - 1n } } : m,
    );
    expect(pricingSnapshotId(input)).not.toBe(base);
    expect(pricingSnapshotId(output)).not.toBe(base);
    expect(pricingSnapshotId(input)).not.toBe(pricingSnapshotId(output));
  });

  it("changes when input and output prices swap, or a model is added or removed", () => {
    const base = pricingSnapshotId(models);
    const swapped = models.map((m, i) =>
      i === 1
        ? {
            ...m,
            pricing: {
              inputPerMillion: m.pricing.outputPerMillion,
              outputPerMillion: m.pricing.inputPerMillion,
            },
          }
        : m,
    );
    expect(pricingSnapshotId(swapped)).not.toBe(base);
    expect(pricingSnapshotId(models.slice(0, 2))).not.toBe(base);
    expect(
      pricingSnapshotId([...models, { id: "extra", pricing: { inputPerMillion: 1n, outputPerMillion: 1n } }]),
    ).not.toBe(base);
  });
});
