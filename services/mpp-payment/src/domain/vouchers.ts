import { Session } from "mppx/tempo";
import { SignatureEnvelope } from "ox/tempo";
import type { Address, Hex } from "viem";
import type { ChannelDescriptor } from "./ports.js";

const SECP256K1_HALF_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n / 2n;
const P256_HALF_N = 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551n / 2n;

/** The voucher signer a descriptor names: authorizedSigner, or the payer when that is zero
 * (the escrow's own rule, so a voucher we accept is one the escrow would settle). */
export function expectedSigner(descriptor: ChannelDescriptor): Address {
  return Session.Precompile.Channel.resolveAuthorizedSigner(descriptor);
}

/** True when the signature's s is in the lower half of its curve order (the spec demands low-s). */
function isLowS(signature: Hex): boolean {
  try {
    const envelope = SignatureEnvelope.from(signature);
    if (envelope.type === "secp256k1") return envelope.signature.s <= SECP256K1_HALF_N;
    if (envelope.type === "p256" || envelope.type === "webAuthn") return envelope.signature.s <= P256_HALF_N;
    return false;
  } catch {
    return false;
  }
}

/**
 * Verifies a TIP-1034 voucher: EIP-712 "TIP20 Channel Reserve"/1 `Voucher(bytes32,uint96)`
 * over this escrow and chain, a canonical primitive signature envelope with low s, signed by
 * `signer` (always taken from the stored or on-chain descriptor, never from the request alone).
 */
export function verifyVoucherSignature(
  escrow: Address,
  chainId: number,
  channelId: Hex,
  cumulative: bigint,
  signature: Hex,
  signer: Address,
): boolean {
  if (!isLowS(signature)) return false;
  return Session.Precompile.Voucher.verifyVoucher(
    escrow,
    chainId,
    { channelId, cumulativeAmount: cumulative, signature },
    signer,
  );
}
