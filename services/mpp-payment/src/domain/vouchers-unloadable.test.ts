import { Secp256k1 } from "ox";
import { Channel, SignatureEnvelope } from "ox/tempo";
import type { Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { describe, expect, it, vi } from "vitest";
import { verifyVoucherSignature, voucherPayload } from "./vouchers.js";

// A deployment whose recovery library cannot load (a bundle without its .wasm, say) is broken on
// our side: the payer's voucher must not be answered as an invalid signature.
vi.mock("tiny-secp256k1", () => {
  throw new Error("ENOENT: secp256k1.wasm");
});

describe("a voucher when the recovery library cannot load", () => {
  it("fails as this service's error, not as the payer's invalid signature", async () => {
    const key = generatePrivateKey();
    const channelId = `0x${"cd".repeat(32)}` as Hex;
    const payload = voucherPayload(Channel.address, 4217, channelId, 10n);
    const signature = SignatureEnvelope.serialize(
      SignatureEnvelope.from(Secp256k1.sign({ payload, privateKey: key })),
    ) as Hex;
    await expect(
      verifyVoucherSignature(
        Channel.address,
        4217,
        channelId,
        10n,
        signature,
        privateKeyToAccount(key).address,
      ),
    ).rejects.toThrow();
  });
});
