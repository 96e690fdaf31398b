import { Secp256k1 } from "ox";
import { Channel, SignatureEnvelope } from "ox/tempo";
import type { Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { describe, expect, it, vi } from "vitest";
import { verifyVoucherSignature, voucherPayload } from "./vouchers.js";

// A deployment whose recovery library cannot load (a bundle without its .wasm, say) is broken on
// our side: the payer's voucher must not be answered as an invalid signature. Here the first load
// fails and a later one finds the module, as after a file is restored or memory freed.
const loads = vi.hoisted(() => ({ count: 0 }));
vi.mock("tiny-secp256k1", async (importActual) => {
  if (loads.count++ === 0) throw new Error("ENOENT: secp256k1.wasm");
  return importActual();
});

describe("a voucher when the recovery library cannot load", () => {
  const key = generatePrivateKey();
  const channelId = `0x${"cd".repeat(32)}` as Hex;
  const payload = voucherPayload(Channel.address, 4217, channelId, 10n);
  const signature = SignatureEnvelope.serialize(
    SignatureEnvelope.from(Secp256k1.sign({ payload, privateKey: key })),
  ) as Hex;
  const verifyGood = () =>
    verifyVoucherSignature(
      Channel.address,
      4217,
      channelId,
      10n,
      signature,
      privateKeyToAccount(key).address,
    );

  it("fails as this service's error, not as the payer's invalid signature", async () => {
    await expect(verifyGood()).rejects.toThrow();
  });

  it("tries the load again on the next voucher, which then verifies", async () => {
    await expect(verifyGood()).resolves.toBe(true);
    expect(loads.count).toBe(2);
  });
});
