import { describe, expect, it } from "vitest";
import { generateKeyId, generateSecret, keyState, randomBase62, validUntil } from "./keys.js";
import type { KeyRecord } from "./ports.js";

const T = new Date("2025-06-01T12:00:00Z");
const at = (s: number) => new Date(T.getTime() + s * 1_000);
const key = (over: Partial<KeyRecord> = {}): KeyRecord => ({
  keyId: "k",
  hash: Buffer.alloc(32),
  accountId: "a",
  connectionId: "c",
  name: "",
  createdAt: T,
  last4: "",
  ...over,
});

describe("secrets", () => {
  it("are tg_ plus 40 base62 characters, all different", () => {
    const seen = new Set<string>();
    for (let i = 0; i < 1_000; i++) {
      const s = generateSecret();
      expect(s).toMatch(/^tg_[0-9A-Za-z]{40}$/);
      seen.add(s);
    }
    expect(seen.size).toBe(1_000);
    expect(generateKeyId()).toMatch(/^key_[0-9A-Za-z]{16}$/);
  });

  it("use every base62 character about equally", () => {
    const counts = new Map<string, number>();
    for (const c of randomBase62(62_000)) counts.set(c, (counts.get(c) ?? 0) + 1);
    expect(counts.size).toBe(62);
    for (const n of counts.values()) expect(n).toBeGreaterThan(800);
  });
});

describe("keyState", () => {
  it("tells active, rotating, rotated, expired and revoked apart", () => {
    expect(keyState(key(), T)).toBe("active");
    expect(keyState(key({ expiresAt: at(10) }), at(9))).toBe("active");
    expect(keyState(key({ expiresAt: at(10) }), at(10))).toBe("expired");
    expect(keyState(key({ graceEndsAt: at(10) }), at(9))).toBe("rotating");
    expect(keyState(key({ graceEndsAt: at(10) }), at(10))).toBe("rotated");
    expect(keyState(key({ graceEndsAt: at(10), revokedAt: at(1) }), at(5))).toBe("revoked");
    // Whichever ended the key first names the state.
    expect(keyState(key({ graceEndsAt: at(10), expiresAt: at(5) }), at(20))).toBe("expired");
    expect(keyState(key({ graceEndsAt: at(5), expiresAt: at(10) }), at(20))).toBe("rotated");
  });

  it("says until when a key works", () => {
    expect(validUntil(key())).toBeUndefined();
    expect(validUntil(key({ expiresAt: at(10), graceEndsAt: at(5) }))).toEqual(at(5));
    expect(validUntil(key({ expiresAt: at(10) }))).toEqual(at(10));
  });
});
