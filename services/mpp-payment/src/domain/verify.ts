import type { Hex } from "viem";
import { loadOrAdopt } from "./adopt.js";
import { MAX_AMOUNT, storable } from "./amounts.js";
import { checkClose } from "./close.js";
import { failed, type PaymentContext, same } from "./context.js";
import {
  type Authenticated,
  authenticate,
  type CredentialedRequest,
  checkAllowed,
  checkSignature,
  checkSource,
  type Verified,
} from "./credential.js";
import { PaymentError } from "./errors.js";
import {
  challengeUse,
  challengeUsed,
  type HoldTerms,
  holdTerms,
  type Reserved,
  reserve,
  reservedOf,
} from "./holds.js";
import type { OnChainState, ReserveOutcome } from "./ports.js";
import { sessionReceipt } from "./receipts.js";
import { channelTag, safeCause } from "./safe-log.js";
import type { SessionPayload } from "./session-payload.js";

/** What an accepted open or voucher leaves the channel at. */
interface Accepted {
  cumulative: bigint;
  spent: bigint;
  units: number;
}

/** Verifies a credential; open and topUp are broadcast and confirmed on chain before this returns. */
export async function verify(ctx: PaymentContext, req: CredentialedRequest): Promise<Verified> {
  return verifyAuthenticated(ctx, authenticate(ctx, req));
}

/** A verified credential, and the hold of its request when one could be taken. */
export interface VerifiedAndHeld {
  verified: Verified;
  held?: Reserved;
}

/**
 * Verifies a credential and, when it pays for content (an open or voucher with a body), holds
 * the request's quote for `requestId` in the same call (docs/paid-door.md, "One round trip"). A
 * hold that cannot be taken does not fail the verification: the credential was accepted (an
 * open broadcast), and its receipt must reach the caller; a Reserve then says why. Except a
 * challenge another request's hold already consumed: that credential is a replay, refused
 * mpp_invalid_challenge in the same store step (docs/paid-door.md, "One challenge, one
 * request"); a retry of this request (the same `requestId`) is the same hold.
 */
export async function verifyAndReserve(
  ctx: PaymentContext,
  req: CredentialedRequest,
  requestId: string,
): Promise<VerifiedAndHeld> {
  const auth = authenticate(ctx, req);
  const { action } = auth.payload;
  if (action === "voucher" && req.body.length > 0) {
    // A quote out of bounds takes no hold: the voucher is still accepted, and a Reserve says why.
    const { id, expires } = auth.verified;
    const use = challengeUse(ctx, id, expires);
    let terms: HoldTerms | undefined;
    try {
      terms = holdTerms(ctx, auth.payload.channelId, requestId, auth.verified.quote, use);
    } catch {
      terms = undefined;
    }
    return verifyVoucher(ctx, auth, terms);
  }
  if (action !== "open" || req.body.length === 0) return { verified: await verifyAuthenticated(ctx, auth) };
  const verified = await verifyAuthenticated(ctx, auth);
  const held = await reserve(
    ctx,
    verified.channelId,
    requestId,
    verified.quote.toString(),
    verified.challengeId,
    auth.verified.expires,
  ).catch((err: unknown) => {
    // A replayed open: another request's hold consumed its challenge.
    if (err instanceof PaymentError && err.code === "mpp_invalid_challenge") throw err;
    return undefined;
  });
  return { verified, held };
}

/** A channel whose deposit is gone or whose payer asked to close it on chain takes no voucher. */
function checkLive(state: OnChainState): void {
  if (state.deposit === 0n) throw failed("channel is not funded on chain");
  if (state.closeRequestedAt !== 0) throw failed("channel has a pending close request");
}

/** The verified credential's fields every action answers. */
function verifiedOf({ verified, payload: p }: Authenticated) {
  return {
    action: p.action,
    channelId: p.channelId,
    challengeId: verified.id,
    binding: verified.binding,
    quote: verified.quote,
  };
}

/**
 * An accepted open or voucher: its receipt is built when read. A request whose hold is taken in
 * the same call answers its errors with the hold's receipt instead (the same spend before the
 * request), and never pays for this one.
 */
function acceptedAs(ctx: PaymentContext, auth: Authenticated, a: Accepted): Verified {
  let receipt: string | undefined;
  return {
    ...verifiedOf(auth),
    acceptedCumulative: a.cumulative,
    get acceptedReceipt() {
      receipt ??= sessionReceipt({
        challengeId: auth.verified.id,
        channelId: auth.payload.channelId,
        acceptedCumulative: a.cumulative,
        spent: a.spent,
        units: a.units,
        at: ctx.now(),
      });
      return receipt;
    },
  };
}

/** Verifies an authenticated credential: the channel's part (verify). */
async function verifyAuthenticated(ctx: PaymentContext, auth: Authenticated): Promise<Verified> {
  const { verified, payload: p, source } = auth;
  const base = verifiedOf(auth);
  switch (p.action) {
    case "open":
      return acceptedAs(ctx, auth, await verifyOpen(ctx, p, source));
    case "voucher":
      return (await verifyVoucher(ctx, auth)).verified;
    case "topUp": {
      const { accepted, receipt } = await verifyTopUp(ctx, p, source, verified.id);
      return { ...base, acceptedCumulative: accepted, paymentReceipt: receipt };
    }
    case "close": {
      // Checked without acting on it; the caller sends it on to Close. A retried close of a
      // closed channel passes only when it repeats the recorded close amount.
      const record = await checkClose(ctx, p, source);
      if (record.status === "closed" && record.closed?.cumulative !== p.cumulativeAmount) {
        throw failed("channel is already closed");
      }
      return { ...base, acceptedCumulative: record.highest.cumulative };
    }
  }
}

/**
 * "voucher": accepts the voucher and, given `terms`, holds the request's quote in the same store
 * step. The voucher reused across requests (docs/contract.md, "Payment sessions", rule 4) is
 * byte for byte the one already verified and stored: its signature is not recovered again.
 */
async function verifyVoucher(
  ctx: PaymentContext,
  auth: Authenticated,
  terms?: HoldTerms,
): Promise<VerifiedAndHeld> {
  const { payload: p, source, seen } = auth;
  if (p.action !== "voucher") throw failed("credential is not a voucher");
  const { accepted, held } = await acceptVoucher(ctx, p, source, !seen, terms);
  // A replay: the store step found the challenge consumed by another request's hold.
  if (terms && held?.kind === "used") throw challengeUsed();
  if (terms && held?.kind === "reserved") {
    const reserved = reservedOf(terms, held, auth.verified.id);
    // With the hold, its receipt is the accepted voucher's too: the spend before the request.
    const verified = {
      ...verifiedOf(auth),
      acceptedCumulative: accepted.cumulative,
      acceptedReceipt: reserved.receipt,
    };
    return { verified, held: reserved };
  }
  return { verified: acceptedAs(ctx, auth, accepted) };
}

/**
 * Offers an open's or voucher's cumulative voucher to its channel (vouchers are cumulative: each
 * one authorizes the total spend so far, so a lower one adds nothing) and, given `hold`, takes
 * the hold in the same atomic store step: one store round trip for a known channel. The checks
 * that need no stored state run first: payer allowlist, credential source, the signature (when
 * `signatureFirst`, else only when the voucher is not the channel's accepted one) and the
 * channel's on-chain state; the store checks the rest in its step (docs/paid-door.md, "One
 * round trip"). A channel the store does not know is adopted from the chain (adopt.ts).
 */
async function acceptVoucher(
  ctx: PaymentContext,
  p: Extract<SessionPayload, { action: "open" | "voucher" }>,
  source: string | undefined,
  signatureFirst: boolean,
  hold?: HoldTerms,
): Promise<{ accepted: Accepted; held?: ReserveOutcome }> {
  // The descriptor is the stored one: the channel id is its hash (authenticate checked it).
  checkAllowed(ctx, p.descriptor.payer);
  checkSource(ctx, source, p);
  const { channelId, cumulativeAmount: cumulative, signature } = p;
  let checked = false;
  const check = async () => {
    await checkSignature(ctx, channelId, cumulative, signature, p);
    checked = true;
  };
  if (signatureFirst) await check();
  let state = await ctx.chainState(channelId);
  let fresh = false;
  const refresh = async () => {
    state = await ctx.chainState(channelId, true);
    fresh = true;
  };
  checkLive(state);
  let adopted = false;
  for (;;) {
    const outcome = await ctx.store.offerVoucher(
      channelId,
      {
        cumulative,
        signature,
        checked,
        chainDeposit: state.deposit > MAX_AMOUNT ? MAX_AMOUNT : state.deposit,
        chainSettled: state.settled,
      },
      hold && {
        reservationId: hold.reservationId,
        amount: hold.quote,
        now: hold.at,
        expiresAt: hold.expiresAt,
        ...(hold.challenge ? { challenge: hold.challenge } : {}),
      },
    );
    switch (outcome.kind) {
      case "accepted":
      case "same": {
        const accepted = { cumulative: outcome.accepted, spent: outcome.spent, units: outcome.units };
        return outcome.held ? { accepted, held: outcome.held } : { accepted };
      }
      case "unchecked":
        await check();
        break;
      case "above_deposit":
        // Above the deposit known: the channel may have been topped up since the cached read.
        if (fresh) {
          throw new PaymentError(
            "mpp_session_deposit_below_request_cost",
            "the session deposit is lower than the voucher authorization",
          );
        }
        await refresh();
        checkLive(state);
        break;
      case "unknown":
        if (adopted) throw failed("channel is unknown");
        await loadOrAdopt(ctx, p, source);
        adopted = true;
        state = await ctx.chainState(channelId);
        break;
      case "stale":
        throw failed("voucher is below the accepted cumulative");
      case "not_open":
        throw failed("channel is closing or closed");
      case "settled":
        throw failed("voucher is not above the settled amount");
    }
  }
}

/**
 * "open": validate completely, then broadcast at once, confirm, record: nothing reaches the
 * chain that the gateway would then refuse.
 */
async function verifyOpen(
  ctx: PaymentContext,
  p: Extract<SessionPayload, { action: "open" }>,
  source: string | undefined,
): Promise<Accepted> {
  const { store, chain, log } = ctx;
  const existing = await store.get(p.channelId);
  // A replayed open (the client retried after a lost answer) is its voucher again.
  if (existing) return (await acceptVoucher(ctx, p, source, false)).accepted;
  checkAllowed(ctx, p.descriptor.payer);
  checkSource(ctx, source, p);
  if (p.authorizedSigner !== undefined && !same(p.authorizedSigner, p.descriptor.authorizedSigner)) {
    throw failed("authorized signer does not match the descriptor");
  }
  await checkSignature(ctx, p.channelId, p.cumulativeAmount, p.signature, p);
  let deposit: bigint;
  try {
    deposit = chain.checkOpen(p.transaction, p.descriptor, p.channelId).deposit;
  } catch (err) {
    log.info({ channel: channelTag(p.channelId), cause: safeCause(err) }, "open transaction rejected");
    throw failed("open transaction does not match the credential", err);
  }
  if (!storable(deposit)) throw failed("open deposit is out of range");
  if (p.cumulativeAmount > deposit) {
    throw new PaymentError(
      "mpp_session_deposit_below_request_cost",
      "the session deposit is lower than the voucher authorization",
    );
  }
  let opened: { deposit: bigint; settled: bigint };
  try {
    const r = await chain.submitOpen(p.transaction, p.descriptor, p.channelId);
    opened = { deposit: r.deposit, settled: 0n };
    log.info({ channel: channelTag(p.channelId) }, "channel opened");
  } catch (err) {
    // The open may have landed anyway (a lost reply, a second replica broadcasting the same
    // credential): the channel id binds the descriptor, so a live channel on chain is this one.
    const state = await chain.state(p.channelId).catch(() => undefined);
    if (!state || state.deposit === 0n || state.closeRequestedAt !== 0) {
      log.warn({ channel: channelTag(p.channelId), cause: safeCause(err) }, "open broadcast failed");
      throw failed("open transaction could not be confirmed on chain", err);
    }
    log.info({ channel: channelTag(p.channelId) }, "channel found open on chain after a failed broadcast");
    opened = { deposit: state.deposit > MAX_AMOUNT ? MAX_AMOUNT : state.deposit, settled: state.settled };
  }
  const created = await store.create({
    channelId: p.channelId,
    descriptor: p.descriptor,
    deposit: opened.deposit,
    settled: opened.settled,
    voucher: { cumulative: p.cumulativeAmount, signature: p.signature },
  });
  if (created) return { cumulative: p.cumulativeAmount, spent: 0n, units: 0 };
  return (await acceptVoucher(ctx, p, source, true)).accepted;
}

/** "topUp": the channel must be known; broadcast, confirm TopUp, raise the deposit. */
async function verifyTopUp(
  ctx: PaymentContext,
  p: Extract<SessionPayload, { action: "topUp" }>,
  source: string | undefined,
  challengeId: string,
): Promise<{ accepted: bigint; receipt: string }> {
  const { store, chain, log } = ctx;
  const record = await loadOrAdopt(ctx, p, source);
  if (record.status !== "open") throw failed("channel is closing or closed");
  checkAllowed(ctx, record.descriptor.payer);
  if (p.additionalDeposit === 0n) throw failed("top-up adds nothing");
  try {
    chain.checkTopUp(p.transaction, record.descriptor, p.channelId, p.additionalDeposit);
  } catch (err) {
    log.info({ channel: channelTag(p.channelId), cause: safeCause(err) }, "top-up transaction rejected");
    throw failed("top-up transaction does not match the channel", err);
  }
  let txHash: Hex;
  let deposit: bigint;
  try {
    ({ txHash, deposit } = await chain.submitTopUp(
      p.transaction,
      record.descriptor,
      p.channelId,
      p.additionalDeposit,
    ));
  } catch (err) {
    log.warn({ channel: channelTag(p.channelId), cause: safeCause(err) }, "top-up broadcast failed");
    throw failed("top-up transaction could not be confirmed on chain", err);
  }
  ctx.forgetState(p.channelId);
  await store.raiseDeposit(p.channelId, deposit > MAX_AMOUNT ? MAX_AMOUNT : deposit);
  log.info({ channel: channelTag(p.channelId) }, "channel topped up");
  const after = (await store.get(p.channelId)) ?? record;
  const receipt = sessionReceipt({
    challengeId,
    channelId: p.channelId,
    acceptedCumulative: after.highest.cumulative,
    spent: after.spent,
    units: after.units,
    txHash,
    at: ctx.now(),
  });
  return { accepted: after.highest.cumulative, receipt };
}
