import { Session } from "mppx/tempo";
import { Channel, SignatureEnvelope } from "ox/tempo";
import {
  type Address,
  concat,
  encodeAbiParameters,
  type Hex,
  hashTypedData,
  hexToBytes,
  isAddressEqual,
  keccak256,
} from "viem";
import type { ChannelDescriptor } from "./ports.js";

type Libsecp256k1 = typeof import("tiny-secp256k1");
let libsecp256k1: Promise<Libsecp256k1> | undefined;

/**
 * ecrecover, as the escrow settles a voucher: the address of the secp256k1 key that signed
 * `digest` with (r, s) and the recovery bit, or undefined when none did. libsecp256k1 compiled to
 * WebAssembly (tiny-secp256k1) recovers in about a tenth of @noble/curves' CPU
 * (docs/performance.md, "A new voucher's recovery in WebAssembly"); it is loaded on the first
 * recovery, not at start: its compiled code is about 20 MB of memory an idle mpp-payment, or one
 * whose payers reuse their vouchers, does not carry.
 */
async function recoverSigner(
  digest: Hex,
  r: bigint,
  s: bigint,
  yParity: number,
): Promise<Address | undefined> {
  // A failed load is not remembered: the next recovery tries again.
  libsecp256k1 ??= import("tiny-secp256k1").catch((err: unknown) => {
    libsecp256k1 = undefined;
    throw err;
  });
  const lib = await libsecp256k1;
  const rs = new Uint8Array(64);
  rs.set(hexToBytes(`0x${r.toString(16).padStart(64, "0")}`), 0);
  rs.set(hexToBytes(`0x${s.toString(16).padStart(64, "0")}`), 32);
  let key: Uint8Array | null;
  try {
    // Refuses r or s of zero or not below the curve order, as ecrecover does.
    key = lib.recover(hexToBytes(digest), rs, yParity === 1 ? 1 : 0, false);
  } catch {
    return undefined;
  }
  // The address is the last 20 bytes of the uncompressed key's hash, without its 0x04 prefix.
  return key === null ? undefined : (`0x${keccak256(key.subarray(1)).slice(-40)}` as Address);
}

const SECP256K1_HALF_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n / 2n;
const P256_HALF_N = 0xffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551n / 2n;

/** The voucher signer a descriptor names: authorizedSigner, or the payer when that is zero
 * (the escrow's own rule, so a voucher we accept is one the escrow would settle). */
export function expectedSigner(descriptor: ChannelDescriptor): Address {
  return Session.Precompile.Channel.resolveAuthorizedSigner(descriptor);
}

/** True when the envelope's s is in the lower half of its curve order (the spec demands low-s). */
function isLowS(envelope: SignatureEnvelope.SignatureEnvelope): boolean {
  if (envelope.type === "secp256k1") return envelope.signature.s <= SECP256K1_HALF_N;
  if (envelope.type === "p256" || envelope.type === "webAuthn") return envelope.signature.s <= P256_HALF_N;
  return false;
}

const separators = new Map<number, Hex>();
const VOUCHER_HASH_PARAMETERS = [{ type: "bytes32" }, { type: "bytes32" }, { type: "uint96" }] as const;

/** The digest a voucher's signer signs: the escrow precompile's own sign payload, or EIP-712
 * over another escrow's domain (the same choice the mppx client signs with). */
export function voucherPayload(escrow: Address, chainId: number, channelId: Hex, cumulative: bigint): Hex {
  if (escrow.toLowerCase() === Channel.address.toLowerCase()) {
    // Channel.getVoucherSignPayload's digest, with the chain's domain separator (a constant per
    // chain) hashed once instead of on every voucher: one Keccak-256 in pure JavaScript fewer.
    let separator = separators.get(chainId);
    if (separator === undefined) {
      separator = Channel.domainSeparator({ chainId });
      if (separators.size < 16) separators.set(chainId, separator);
    }
    const voucherHash = keccak256(
      encodeAbiParameters(VOUCHER_HASH_PARAMETERS, [Channel.voucherTypehash, channelId, cumulative]),
    );
    return keccak256(concat(["0x1901", separator, voucherHash]));
  }
  return hashTypedData({
    domain: Session.Precompile.Voucher.getVoucherDomain(escrow, chainId),
    types: Session.Precompile.Voucher.voucherTypes,
    primaryType: "Voucher",
    message: { channelId, cumulativeAmount: cumulative },
  });
}

/**
 * Verifies a TIP-1034 voucher: EIP-712 "TIP20 Channel Reserve"/1 `Voucher(bytes32,uint96)`
 * over this escrow and chain, a canonical primitive signature envelope with low s, signed by
 * `signer` (always taken from the stored or on-chain descriptor, never from the request alone).
 *
 * A secp256k1 signature is verified by recovering its signer once (ecrecover, as the escrow
 * settles it) and comparing; mppx's `verifyVoucher` recovers it twice, and the recovery is most
 * of a new voucher's CPU (docs/performance.md, "One recovery per new voucher"). p256 and
 * WebAuthn envelopes carry their public key and go through mppx's check.
 */
export async function verifyVoucherSignature(
  escrow: Address,
  chainId: number,
  channelId: Hex,
  cumulative: bigint,
  signature: Hex,
  signer: Address,
): Promise<boolean> {
  let recovery: { payload: Hex; r: bigint; s: bigint; yParity: number };
  try {
    const envelope = SignatureEnvelope.from(signature);
    if (!isLowS(envelope)) return false;
    if (envelope.type !== "secp256k1") {
      return Session.Precompile.Voucher.verifyVoucher(
        escrow,
        chainId,
        { channelId, cumulativeAmount: cumulative, signature },
        signer,
      );
    }
    // Canonical encoding only: one signature, one spelling.
    if (SignatureEnvelope.serialize(envelope).toLowerCase() !== signature.toLowerCase()) return false;
    const { r, s, yParity } = envelope.signature;
    recovery = { payload: voucherPayload(escrow, chainId, channelId, cumulative), r, s, yParity };
  } catch {
    return false;
  }
  // Outside the catch: a recovery library that fails to load is this service's fault, answered
  // as an internal error, never as the payer's invalid signature.
  const recovered = await recoverSigner(recovery.payload, recovery.r, recovery.s, recovery.yParity);
  return recovered !== undefined && isAddressEqual(recovered, signer);
}
