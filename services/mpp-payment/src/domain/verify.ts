import type { Hex } from "viem";
import { loadOrAdopt } from "./adopt.js";
import { MAX_AMOUNT, maxOf, storable } from "./amounts.js";
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
import { holdTerms, type Reserved, reserve, reservedOf } from "./holds.js";
import type { ChannelRecord, OnChainState } from "./ports.js";
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
 * open broadcast), and its receipt must reach the caller; a Reserve then says why.
 */
export async function verifyAndReserve(
  ctx: PaymentContext,
  req: CredentialedRequest,
  requestId: string,
): Promise<VerifiedAndHeld> {
  const auth = authenticate(ctx, req);
  const { action } = auth.payload;
  if ((action !== "open" && action !== "voucher") || req.body.length === 0) {
    return { verified: await verifyAuthenticated(ctx, auth) };
  }
  const reused = action === "voucher" ? await holdOnAcceptedVoucher(ctx, auth, requestId) : undefined;
  if (reused) return reused;
  const verified = await verifyAuthenticated(ctx, auth);
  const held = await reserve(
    ctx,
    verified.channelId,
    requestId,
    verified.quote.toString(),
    verified.challengeId,
  ).catch(() => undefined);
  return { verified, held };
}

/**
 * The reused voucher (docs/contract.md, "Payment sessions", rule 4): when the voucher is byte for
 * byte the channel's accepted one, nothing about it needs verifying again, and the check that it
 * still is and the hold are one store step. Undefined when that step takes no hold (another
 * voucher, a closed channel, a bucket to refresh, a quote out of bounds): the caller goes the
 * long way, which verifies the voucher and says why.
 */
async function holdOnAcceptedVoucher(
  ctx: PaymentContext,
  { verified, payload: p, source }: Authenticated,
  requestId: string,
): Promise<VerifiedAndHeld | undefined> {
  if (p.action !== "voucher" || verified.quote <= 0n || verified.quote > ctx.s.bucket) return undefined;
  // The descriptor is the stored one: the channel id is its hash (authenticate checked it).
  checkAllowed(ctx, p.descriptor.payer);
  checkSource(ctx, source, p);
  checkLive(await ctx.chainState(p.channelId));
  const terms = holdTerms(ctx, p.channelId, requestId, verified.quote);
  const outcome = await ctx.store.reserveOnVoucher(
    p.channelId,
    { cumulative: p.cumulativeAmount, signature: p.signature },
    terms.reservationId,
    terms.quote,
    terms.at,
    terms.expiresAt,
  );
  if (outcome.kind !== "reserved") return undefined;
  const held = reservedOf(terms, outcome, verified.challenge.id);
  return {
    verified: {
      action: p.action,
      channelId: p.channelId,
      challengeId: verified.challenge.id,
      binding: verified.binding,
      quote: verified.quote,
      acceptedCumulative: outcome.accepted,
      // With the hold, its receipt is the accepted voucher's too: the spend before the request.
      acceptedReceipt: held.receipt,
    },
    held,
  };
}

/** A channel whose deposit is gone or whose payer asked to close it on chain takes no voucher. */
function checkLive(state: OnChainState): void {
  if (state.deposit === 0n) throw failed("channel is not funded on chain");
  if (state.closeRequestedAt !== 0) throw failed("channel has a pending close request");
}

/** Verifies an authenticated credential: the channel's part (verify). */
async function verifyAuthenticated(ctx: PaymentContext, auth: Authenticated): Promise<Verified> {
  const { verified, payload: p, source } = auth;
  const base = {
    action: p.action,
    channelId: p.channelId,
    challengeId: verified.challenge.id,
    binding: verified.binding,
    quote: verified.quote,
  };
  // Built when read: a request whose hold is taken in the same call answers its errors with the
  // hold's receipt instead (the same spend before the request), and never pays for this one.
  const acceptedAs = (a: Accepted) => {
    let receipt: string | undefined;
    return {
      ...base,
      acceptedCumulative: a.cumulative,
      get acceptedReceipt() {
        receipt ??= sessionReceipt({
          challengeId: verified.challenge.id,
          channelId: p.channelId,
          acceptedCumulative: a.cumulative,
          spent: a.spent,
          units: a.units,
          at: ctx.now(),
        });
        return receipt;
      },
    };
  };
  switch (p.action) {
    case "open":
      return acceptedAs(await verifyOpen(ctx, p, source));
    case "voucher":
      return acceptedAs(await acceptVoucher(ctx, p, await loadOrAdopt(ctx, p, source), source));
    case "topUp": {
      const { accepted, receipt } = await verifyTopUp(ctx, p, source, verified.challenge.id);
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

/** Raises (or re-accepts) the cumulative voucher of a known channel. Vouchers are
 * cumulative: each one authorizes the total spend so far, so a lower or equal one adds nothing. */
async function acceptVoucher(
  ctx: PaymentContext,
  p: Extract<SessionPayload, { action: "open" | "voucher" }>,
  record: ChannelRecord,
  source: string | undefined,
): Promise<Accepted> {
  const { store } = ctx;
  if (record.status !== "open") throw failed("channel is closing or closed");
  checkAllowed(ctx, record.descriptor.payer);
  checkSource(ctx, source, record);
  const cumulative = p.cumulativeAmount;
  // The voucher reused across requests (docs/contract.md, "Payment sessions", rule 4) is byte for
  // byte the one already verified and stored: recovering its signer again would only burn CPU on
  // every request.
  const reused =
    cumulative === record.highest.cumulative &&
    p.signature.toLowerCase() === record.highest.signature.toLowerCase();
  if (!reused) checkSignature(ctx, p.channelId, cumulative, p.signature, record);
  const highest = record.highest.cumulative;
  if (cumulative < highest) throw failed("voucher is below the accepted cumulative");
  let state = await ctx.chainState(p.channelId);
  if (cumulative > maxOf(record.deposit, state.deposit)) state = await ctx.chainState(p.channelId, true);
  checkLive(state);
  if (cumulative > highest) {
    if (cumulative <= maxOf(record.settled, state.settled))
      throw failed("voucher is not above the settled amount");
    const deposit = maxOf(record.deposit, state.deposit);
    if (cumulative > deposit) {
      throw new PaymentError(
        "mpp_session_deposit_below_request_cost",
        "the session deposit is lower than the voucher authorization",
      );
    }
    if (deposit > record.deposit)
      await store.raiseDeposit(p.channelId, deposit > MAX_AMOUNT ? MAX_AMOUNT : deposit);
  }
  const outcome = await store.acceptVoucher(p.channelId, { cumulative, signature: p.signature });
  switch (outcome.kind) {
    case "accepted":
    case "same":
      return { cumulative: outcome.highest, spent: record.spent, units: record.units };
    case "stale":
      throw failed("voucher is below the accepted cumulative");
    case "not_open":
      throw failed("channel is closing or closed");
    case "unknown":
      throw failed("channel is unknown");
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
  if (existing) return acceptVoucher(ctx, p, existing, source);
  checkAllowed(ctx, p.descriptor.payer);
  checkSource(ctx, source, p);
  if (p.authorizedSigner !== undefined && !same(p.authorizedSigner, p.descriptor.authorizedSigner)) {
    throw failed("authorized signer does not match the descriptor");
  }
  checkSignature(ctx, p.channelId, p.cumulativeAmount, p.signature, p);
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
  const raced = await store.get(p.channelId);
  if (!raced) throw failed("channel could not be recorded");
  return acceptVoucher(ctx, p, raced, source);
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
