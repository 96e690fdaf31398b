import { type Address, isAddress } from "viem";

/** An address in any checksum case, or undefined. */
export function address(value: unknown): Address | undefined {
  return typeof value === "string" && isAddress(value, { strict: false }) ? value : undefined;
}

/** A raw base-unit amount in canonical decimal (at most 29 digits), or undefined. */
export function parseAmount(value: unknown): bigint | undefined {
  return typeof value === "string" && /^(0|[1-9][0-9]{0,28})$/.test(value) ? BigInt(value) : undefined;
}

/** JSON text parsed, or undefined when it is not JSON. */
export function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
