import { describe, expect, it } from "vitest";
import { acceptRequestId, newRequestId, randomBase62, randomHex } from "./ids.js";

describe("ids", () => {
  it("makes request ids of the documented shape, none repeated over many pool refills", () => {
    const seen = new Set<string>();
    for (let i = 0; i < 5_000; i++) {
      const id = newRequestId();
      expect(id).toMatch(/^req_[0-9a-f]{24}$/);
      seen.add(id);
    }
    expect(seen.size).toBe(5_000);
  });

  it("keeps a printable caller id and replaces anything else", () => {
    expect(acceptRequestId("abc-1")).toBe("abc-1");
    expect(acceptRequestId("bad id\n")).toMatch(/^req_/);
    expect(acceptRequestId(undefined)).toMatch(/^req_/);
  });

  it("never adopts a caller id shaped like a Virtual Key or a wallet address, which every log line would carry", () => {
    for (const secret of [
      "tg_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcd",
      "rid-tg_live_x",
      "0x52908400098527886E0F7030069857D2E4169EE7",
      "pay-0x52908400098527886e0f7030069857d2e4169ee7",
    ]) {
      const id = acceptRequestId(secret);
      expect(id).toMatch(/^req_[0-9a-f]{24}$/);
    }
    expect(acceptRequestId("trace-0x1234")).toBe("trace-0x1234");
    expect(acceptRequestId("build-stg_42")).toBe("build-stg_42");
  });

  it("gives random hex of the asked length, also across a refill of the pool", () => {
    for (let i = 0; i < 300; i++) expect(randomHex(20)).toMatch(/^[0-9a-f]{40}$/);
  });

  it("gives base62 strings whose characters are all used about equally", () => {
    const counts = new Map<string, number>();
    const total = 62 * 2_000;
    for (let i = 0; i < total / 20; i++) {
      const s = randomBase62(20);
      expect(s).toMatch(/^[0-9A-Za-z]{20}$/);
      for (const ch of s) counts.set(ch, (counts.get(ch) ?? 0) + 1);
    }
    expect(counts.size).toBe(62);
    // Each character is expected 2 000 times; a biased draw would skew the first ones by 25 %.
    for (const n of counts.values()) expect(Math.abs(n - 2_000)).toBeLessThan(300);
  });
});
