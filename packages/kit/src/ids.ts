import { randomFillSync } from "node:crypto";

const SAFE_ID = /^[A-Za-z0-9._:-]{1,128}$/;

// Per-request ids draw from one buffer of cryptographic random bytes, refilled when used up:
// a `randomBytes` call per id costs a trip into OpenSSL each time (about 2 µs), a slice of the
// buffer about 0.1 µs. The bytes are as unguessable as `randomBytes` ones (`randomUUID` pools
// the same way); each byte is handed out once.
const POOL_BYTES = 4_096;
const pool = Buffer.allocUnsafe(POOL_BYTES);
let offset = POOL_BYTES;

/** The offset of `n` fresh random bytes in `pool` (n ≤ POOL_BYTES). */
function take(n: number): number {
  if (offset + n > POOL_BYTES) {
    randomFillSync(pool);
    offset = 0;
  }
  const at = offset;
  offset += n;
  return at;
}

/** `bytes` random bytes (at most 4 096) as lower-case hex. */
export function randomHex(bytes: number): string {
  const at = take(bytes);
  return pool.toString("hex", at, at + bytes);
}

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** `length` random base62 characters, each uniform (about 5.95 bits each). */
export function randomBase62(length: number): string {
  let out = "";
  while (out.length < length) {
    const byte = pool[take(1)]!;
    // 248 = 4 × 62: bytes at or above it would favour the first characters.
    if (byte < 248) out += BASE62[byte % 62];
  }
  return out;
}

/** Returns a new request id: "req_" and 24 hex characters. */
export function newRequestId(): string {
  return `req_${randomHex(12)}`;
}

/**
 * What a caller's id must not hold, since every log line of its request carries it: a Virtual
 * Key (its `tg_` prefix at the start of a word, so `build-stg_42` is no key), or a wallet
 * address (docs/operations.md, "Logs").
 */
const SECRET_SHAPED = /(?:^|[^A-Za-z0-9])tg_[A-Za-z0-9]|0x[0-9a-fA-F]{40}/;

/**
 * Accepts a caller-supplied request id only when it is short, printable and not shaped like a
 * secret (a key or a wallet address pasted into it); otherwise makes one.
 */
export function acceptRequestId(candidate: string | undefined): string {
  return candidate !== undefined && SAFE_ID.test(candidate) && !SECRET_SHAPED.test(candidate)
    ? candidate
    : newRequestId();
}
