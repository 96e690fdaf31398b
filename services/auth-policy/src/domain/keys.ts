import { createHash, timingSafeEqual } from "node:crypto";

/** SHA-256 of a Virtual Key: the only form in which keys are stored or compared. */
export function hashKey(secret: string): Buffer {
  return createHash("sha256").update(secret, "utf8").digest();
}

/** Constant-time comparison of two key hashes. */
export function sameHash(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}
