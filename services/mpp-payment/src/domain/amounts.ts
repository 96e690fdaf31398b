/**
 * The largest amount the channel store handles: 2^53 − 1 base units (about 9 billion tokens).
 * Redis Lua compares numbers as doubles, which are exact up to here; TIP-1034 allows uint96,
 * so a larger voucher or deposit is refused rather than rounded.
 */
export const MAX_AMOUNT = BigInt(Number.MAX_SAFE_INTEGER);

const DECIMAL = /^(0|[1-9][0-9]{0,29})$/;

/** Parses a canonical decimal string of base units (no sign, no leading zeros); undefined otherwise. */
export function parseAmount(value: string): bigint | undefined {
  return DECIMAL.test(value) ? BigInt(value) : undefined;
}

/** True when `amount` can be stored: 0 ≤ amount ≤ MAX_AMOUNT. */
export function storable(amount: bigint): boolean {
  return amount >= 0n && amount <= MAX_AMOUNT;
}

/** The larger of two amounts. */
export function maxOf(a: bigint, b: bigint): bigint {
  return a > b ? a : b;
}
