/** p50/p99 (nearest rank) of samples in milliseconds; NaN when there is none. */
export interface Summary {
  count: number;
  p50: number;
  p99: number;
  mean: number;
}

export function summarize(samples: readonly number[]): Summary {
  if (samples.length === 0) return { count: 0, p50: Number.NaN, p99: Number.NaN, mean: Number.NaN };
  const sorted = Float64Array.from(samples).sort();
  const rank = (p: number) =>
    sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!;
  let sum = 0;
  for (const v of sorted) sum += v;
  return { count: sorted.length, p50: rank(0.5), p99: rank(0.99), mean: sum / sorted.length };
}

/** Rounds for display and JSON: 3 decimals below 10, 2 below 100, else 1. */
export function round(v: number): number {
  if (!Number.isFinite(v)) return v;
  const a = Math.abs(v);
  const d = a < 10 ? 1000 : a < 100 ? 100 : 10;
  return Math.round(v * d) / d;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
