import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { KeyRecord } from "./ports.js";

/** SHA-256 of a Virtual Key: the only form in which keys are stored or compared. */
export function hashKey(secret: string): Buffer {
  return createHash("sha256").update(secret, "utf8").digest();
}

/**
 * The id the key's own budget is counted under: its lineage's first key, so that a key and the
 * keys that replaced it by rotation spend from one counter (docs/money.md, "Budget periods").
 * A key stored without a lineage (never rotated from another, or stored before lineages) is its
 * own.
 */
export function lineageOf(key: Pick<KeyRecord, "keyId" | "lineageId">): string {
  return key.lineageId ?? key.keyId;
}

/** Constant-time comparison of two key hashes. */
export function sameHash(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/** `length` uniformly random base62 characters (rejection sampling: no modulo bias). */
export function randomBase62(length: number): string {
  let out = "";
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
      // 248 = 4 × 62: bytes at or above it would favour the first characters.
      if (byte < 248 && out.length < length) out += BASE62[byte % 62];
    }
  }
  return out;
}

/** Prefix of every issued Virtual Key, so secret scanners and people can recognise one. */
export const KEY_PREFIX = "tg_";
/** 40 base62 characters: about 238 bits of randomness. */
const SECRET_LENGTH = 40;

/** A fresh Virtual Key secret: `tg_` + 40 random base62 characters. */
export function generateSecret(): string {
  return KEY_PREFIX + randomBase62(SECRET_LENGTH);
}

/** A fresh key id: `key_` + 16 random base62 characters. Not secret. */
export function generateKeyId(): string {
  return `key_${randomBase62(16)}`;
}

/** The state of a key at `now`. */
export type KeyState = "active" | "rotating" | "rotated" | "expired" | "revoked";

/**
 * Where a key stands at `now`. Revocation wins; otherwise whichever of its expiry and the end of
 * its rotation grace came first decides (both end the key at that instant, not after it).
 */
export function keyState(key: KeyRecord, now: Date): KeyState {
  if (key.revokedAt) return "revoked";
  const t = now.getTime();
  const expires = key.expiresAt?.getTime() ?? Number.POSITIVE_INFINITY;
  const graceEnds = key.graceEndsAt?.getTime() ?? Number.POSITIVE_INFINITY;
  if (Math.min(expires, graceEnds) <= t) return expires <= graceEnds ? "expired" : "rotated";
  return key.graceEndsAt ? "rotating" : "active";
}

/** When the key stops working unless revoked: its expiry or grace end, whichever is first. */
export function validUntil(key: KeyRecord): Date | undefined {
  const ends = [key.expiresAt, key.graceEndsAt].filter((d): d is Date => d !== undefined);
  if (ends.length === 0) return undefined;
  return new Date(Math.min(...ends.map((d) => d.getTime())));
}
