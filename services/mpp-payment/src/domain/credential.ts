import { Session } from "mppx/tempo";
import { type Address, type Hex, zeroAddress } from "viem";
import {
  type Binding,
  checkBodyDigest,
  presentCredential,
  type VerifiedChallenge,
  verifyChallenge,
} from "./challenge.js";
import { failed, type PaymentContext, same } from "./context.js";
import { PaymentError } from "./errors.js";
import type { ChannelRecord } from "./ports.js";
import { parseSessionPayload, type SessionAction, type SessionPayload } from "./session-payload.js";
import { expectedSigner, verifyVoucherSignature } from "./vouchers.js";

/** A request as it reached the paid route, with its credential. */
export interface CredentialedRequest {
  authorization: string;
  httpMethod: string;
  path: string;
  /** Empty for management requests (topUp, close) and for Close. */
  body: Uint8Array;
}

/** A verified credential. */
export interface Verified {
  action: SessionAction;
  channelId: Hex;
  challengeId: string;
  binding: Binding;
  /** The accepted cumulative voucher after this credential. */
  acceptedCumulative: bigint;
  /** The quote bound into the challenge: what Reserve should hold. */
  quote: bigint;
  /** For topUp only: the receipt of the 204 answer. */
  paymentReceipt?: string;
  /**
   * For open and voucher: the receipt of the accepted credential itself, charging nothing (the
   * channel's spend before this request). An answer that fails after this point carries it, so
   * that the payer's client keeps the channel it funded.
   */
  acceptedReceipt?: string;
}

export interface Authenticated {
  verified: VerifiedChallenge;
  payload: SessionPayload;
  source: string | undefined;
  /**
   * A voucher payload this process met before (its text in checkedVouchers): most likely the
   * channel's accepted voucher, reused, whose signature need not be recovered again.
   */
  seen: boolean;
}

/** The credential pipeline shared by Verify and Close: envelope, challenge, payload, digest, descriptor. */
export function authenticate(ctx: PaymentContext, req: CredentialedRequest): Authenticated {
  const { s, catalog } = ctx;
  const presented = presentCredential(req.authorization, s);
  const verified = verifyChallenge(presented, s, { httpMethod: req.httpMethod, path: req.path }, ctx.now());
  // A voucher payload the client reuses across requests (docs/contract.md, "Payment sessions",
  // rule 4) is parsed and bound to its channel once: what that decides depends on its text and
  // this service's fixed settings only.
  const text = presented.payload["action"] === "voucher" ? JSON.stringify(presented.payload) : undefined;
  const known = text === undefined ? undefined : ctx.checkedVouchers.get(text);
  const payload = known ?? parseSessionPayload(presented.payload);
  // Content requests carry the challenge-time body; bodyless management requests (topUp,
  // close) reuse the current challenge, so their digest is not checked: they have no body
  // of their own to bind.
  if (payload.action === "open" || payload.action === "voucher") {
    checkBodyDigest(verified.digest, req.body);
    const { binding } = verified;
    if (
      binding.pricingSnapshotId !== catalog.pricingSnapshotId ||
      !catalog.offers(binding.plan, binding.model)
    ) {
      throw new PaymentError(
        "mpp_invalid_challenge",
        "prices or plans changed since the challenge was issued",
      );
    }
  }
  if (!known) {
    checkDescriptor(ctx, payload);
    if (text !== undefined) ctx.checkedVouchers.set(text, payload);
  }
  return { verified, payload, source: presented.source, seen: known !== undefined };
}

/** The descriptor hashes to the channel id, and names this service's payee, token and no operator. */
function checkDescriptor(ctx: PaymentContext, payload: SessionPayload): void {
  const { s } = ctx;
  const { descriptor } = payload;
  // The id is a hash of these fields alone; a payer's new vouchers name the same descriptor, so
  // it is hashed once (Keccak-256 in pure JavaScript), not on every new voucher. The memo is keyed
  // by the descriptor, never by the channel id the credential names.
  const key = `${descriptor.payer}|${descriptor.payee}|${descriptor.operator}|${descriptor.token}|${descriptor.salt}|${descriptor.authorizedSigner}|${descriptor.expiringNonceHash}`;
  let computed = ctx.channelIds.get(key);
  if (computed === undefined) {
    computed = Session.Precompile.Channel.computeId({ ...descriptor, chainId: s.chainId, escrow: s.escrow });
    ctx.channelIds.set(key, computed);
  }
  if (computed.toLowerCase() !== payload.channelId) throw failed("descriptor does not match the channel id");
  if (!same(descriptor.payee, s.recipient)) throw failed("channel payee is not this service");
  if (!same(descriptor.token, s.currency)) throw failed("channel token is not the session currency");
  if (!same(descriptor.operator, zeroAddress)) throw failed("channel operator is not accepted");
}

/** mppx requires the source DID to be the payer or the authorized signer: a
 * credential from anyone else could spend a channel it does not control. */
export function checkSource(
  ctx: PaymentContext,
  source: string | undefined,
  record: Pick<ChannelRecord, "descriptor">,
): void {
  const prefix = `did:pkh:eip155:${ctx.s.chainId}:`;
  if (!source?.startsWith(prefix)) throw failed("credential source does not name a payer on this chain");
  const address = source.slice(prefix.length);
  const { payer, authorizedSigner } = record.descriptor;
  if (!same(address, payer) && !same(address, authorizedSigner)) {
    throw failed("credential source is neither the payer nor the authorized signer");
  }
}

export function checkAllowed(ctx: PaymentContext, payer: Address): void {
  if (ctx.allowlist && !ctx.allowlist.includes(payer.toLowerCase())) {
    throw new PaymentError("mpp_payer_not_allowed", "the payer is not allowed on this service");
  }
}

export async function checkSignature(
  ctx: PaymentContext,
  channelId: Hex,
  cumulative: bigint,
  signature: Hex,
  record: Pick<ChannelRecord, "descriptor">,
) {
  const { escrow, chainId } = ctx.s;
  if (
    !(await verifyVoucherSignature(
      escrow,
      chainId,
      channelId,
      cumulative,
      signature,
      expectedSigner(record.descriptor),
    ))
  ) {
    throw failed("voucher signature is invalid");
  }
}
