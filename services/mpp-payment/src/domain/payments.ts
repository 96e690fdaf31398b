import { createHash, randomBytes } from "node:crypto";
import { Session } from "mppx/tempo";
import { type Address, type Hex, zeroAddress } from "viem";
import { MAX_AMOUNT, maxOf, parseAmount, storable } from "./amounts.js";
import type { Catalog, PaidRequest } from "./catalog.js";
import {
  type Binding,
  checkBodyDigest,
  type IssuedChallenge,
  issueChallenge,
  presentCredential,
  type VerifiedChallenge,
  verifyChallenge,
} from "./challenge.js";
import { PaymentError } from "./errors.js";
import type { Chain, ChannelRecord, ChannelStore, Log, OnChainState } from "./ports.js";
import { sessionReceipt } from "./receipts.js";
import { channelTag, safeCause } from "./safe-log.js";
import { parseSessionPayload, type SessionAction, type SessionPayload } from "./session-payload.js";
import type { PaymentSettings } from "./settings.js";
import { expectedSigner, verifyVoucherSignature } from "./vouchers.js";

/** What the payment domain is built from. */
export interface PaymentsDeps {
  settings: PaymentSettings;
  catalog: Catalog;
  store: ChannelStore;
  chain: Chain;
  log: Log;
  /** Milliseconds since the epoch. */
  now?: () => number;
  /**
   * How long an on-chain state read is reused when checking vouchers. Default 5 s (mppx's
   * channelStateTtl).
   */
  chainStateTtlMs?: number;
  /** A closing mark older than this is taken to be a crashed close and may be taken over. Default 120 s. */
  staleCloseMs?: number;
}

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

/** What an accepted open or voucher leaves the channel at. */
interface Accepted {
  cumulative: bigint;
  spent: bigint;
  units: number;
}

/** The paid door's payment operations (docs/architecture.md, "The paid door, one request"). */
export interface Payments {
  /** Prices an unpaid request and builds its 402 challenge. */
  challenge(req: PaidRequest): IssuedChallenge;
  /** Verifies a credential; open and topUp are broadcast and confirmed on chain before this returns. */
  verify(req: CredentialedRequest): Promise<Verified>;
  /**
   * Holds `quote` inside the channel's accepted cumulative; returns the reservation id, derived
   * from the channel and `requestId` (a retry with the same id gets the same hold). `requestId`
   * must be the gateway's own per-request id, never one a caller chose.
   */
  reserve(channelId: string, requestId: string, quote: string): Promise<string>;
  /** Records the actual cost and returns the Payment-Receipt; only after the store update succeeded. */
  commit(reservationId: string, channelId: string, challengeId: string, actualCost: string): Promise<string>;
  /** Returns a hold that will not be committed. */
  release(reservationId: string, channelId: string): Promise<void>;
  /** Closes the channel on chain from a close credential; returns the close receipt. */
  close(req: CredentialedRequest): Promise<string>;
}

const CHANNEL_ID = /^0x[0-9a-fA-F]{64}$/;
/** Reservation ids this service hands out (they become part of a store key). */
const RESERVATION_ID = /^rsv_[0-9a-f]{32}$/;

interface Authenticated {
  verified: VerifiedChallenge;
  payload: SessionPayload;
  source: string | undefined;
}

/** Builds the payment operations over a store and a chain. */
export function createPayments(deps: PaymentsDeps): Payments {
  const { settings: s, catalog, store, chain, log } = deps;
  const now = deps.now ?? Date.now;
  const chainStateTtlMs = deps.chainStateTtlMs ?? 5_000;
  const staleCloseMs = deps.staleCloseMs ?? 120_000;
  const allowlist = s.payerAllowlist?.map((a) => a.toLowerCase());
  const stateCache = new Map<Hex, { state: OnChainState; at: number }>();

  const failed = (message: string, cause?: unknown) =>
    new PaymentError("mpp_payment_verification_failed", message, cause === undefined ? undefined : { cause });

  const same = (a: string, b: string) => a.toLowerCase() === b.toLowerCase();

  /** The credential pipeline shared by Verify and Close: envelope, challenge, payload, digest, descriptor. */
  function authenticate(req: CredentialedRequest): Authenticated {
    const presented = presentCredential(req.authorization, s);
    const verified = verifyChallenge(presented, s, { httpMethod: req.httpMethod, path: req.path }, now());
    const payload = parseSessionPayload(presented.payload);
    // Content requests carry the challenge-time body; bodyless management requests (topUp,
    // close) reuse the current challenge, so their digest is not checked: they have no body
    // of their own to bind.
    if (payload.action === "open" || payload.action === "voucher") {
      checkBodyDigest(verified.challenge, req.body);
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
    const { descriptor } = payload;
    const computed = Session.Precompile.Channel.computeId({
      ...descriptor,
      chainId: s.chainId,
      escrow: s.escrow,
    });
    if (computed.toLowerCase() !== payload.channelId)
      throw failed("descriptor does not match the channel id");
    if (!same(descriptor.payee, s.recipient)) throw failed("channel payee is not this service");
    if (!same(descriptor.token, s.currency)) throw failed("channel token is not the session currency");
    if (!same(descriptor.operator, zeroAddress)) throw failed("channel operator is not accepted");
    return { verified, payload, source: presented.source };
  }

  /** mppx requires the source DID to be the payer or the authorized signer: a
   * credential from anyone else could spend a channel it does not control. */
  function checkSource(source: string | undefined, record: Pick<ChannelRecord, "descriptor">): void {
    const prefix = `did:pkh:eip155:${s.chainId}:`;
    if (!source?.startsWith(prefix)) throw failed("credential source does not name a payer on this chain");
    const address = source.slice(prefix.length);
    const { payer, authorizedSigner } = record.descriptor;
    if (!same(address, payer) && !same(address, authorizedSigner)) {
      throw failed("credential source is neither the payer nor the authorized signer");
    }
  }

  function checkAllowed(payer: Address): void {
    if (allowlist && !allowlist.includes(payer.toLowerCase())) {
      throw new PaymentError("mpp_payer_not_allowed", "the payer is not allowed on this service");
    }
  }

  function checkSignature(
    channelId: Hex,
    cumulative: bigint,
    signature: Hex,
    record: Pick<ChannelRecord, "descriptor">,
  ) {
    if (
      !verifyVoucherSignature(
        s.escrow,
        s.chainId,
        channelId,
        cumulative,
        signature,
        expectedSigner(record.descriptor),
      )
    ) {
      throw failed("voucher signature is invalid");
    }
  }

  async function chainState(channelId: Hex, fresh = false): Promise<OnChainState> {
    const cached = stateCache.get(channelId);
    if (!fresh && cached && now() - cached.at < chainStateTtlMs) return cached.state;
    let state: OnChainState;
    try {
      state = await chain.state(channelId);
    } catch (err) {
      log.warn({ channel: channelTag(channelId), cause: safeCause(err) }, "channel state read failed");
      throw failed("channel state could not be read from the chain", err);
    }
    if (stateCache.size > 10_000) stateCache.clear();
    stateCache.set(channelId, { state, at: now() });
    return state;
  }

  /**
   * The stored channel, or one adopted from the chain when the store does not know it (another
   * replica's memory store, a lost record): it must be live on chain. Spend recorded before is
   * unknown then, so it starts at what is settled.
   */
  async function loadOrAdopt(p: SessionPayload, source: string | undefined): Promise<ChannelRecord> {
    const stored = await store.get(p.channelId);
    if (stored) return stored;
    checkSource(source, p);
    const state = await chainState(p.channelId, true);
    if (state.deposit === 0n || state.closeRequestedAt !== 0) throw failed("channel is not open on chain");
    await store.create({
      channelId: p.channelId,
      descriptor: p.descriptor,
      deposit: state.deposit > MAX_AMOUNT ? MAX_AMOUNT : state.deposit,
      settled: state.settled,
      voucher: { cumulative: state.settled, signature: "0x" },
    });
    log.info({ channel: channelTag(p.channelId) }, "channel adopted from chain");
    const adopted = await store.get(p.channelId);
    if (!adopted) throw failed("channel could not be recorded");
    return adopted;
  }

  /** Raises (or re-accepts) the cumulative voucher of a known channel. Vouchers are
   * cumulative: each one authorizes the total spend so far, so a lower or equal one adds nothing. */
  async function acceptVoucher(
    p: Extract<SessionPayload, { action: "open" | "voucher" }>,
    record: ChannelRecord,
    source: string | undefined,
  ): Promise<Accepted> {
    if (record.status !== "open") throw failed("channel is closing or closed");
    checkAllowed(record.descriptor.payer);
    checkSource(source, record);
    const cumulative = p.cumulativeAmount;
    // The voucher reused across requests (docs/contract.md, "Payment sessions", rule 4) is byte for
    // byte the one already verified and stored: recovering its signer again would only burn CPU on
    // every request.
    const reused =
      cumulative === record.highest.cumulative &&
      p.signature.toLowerCase() === record.highest.signature.toLowerCase();
    if (!reused) checkSignature(p.channelId, cumulative, p.signature, record);
    const highest = record.highest.cumulative;
    if (cumulative < highest) throw failed("voucher is below the accepted cumulative");
    let state = await chainState(p.channelId);
    if (cumulative > maxOf(record.deposit, state.deposit)) state = await chainState(p.channelId, true);
    if (state.deposit === 0n) throw failed("channel is not funded on chain");
    if (state.closeRequestedAt !== 0) throw failed("channel has a pending close request");
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
    p: Extract<SessionPayload, { action: "open" }>,
    source: string | undefined,
  ): Promise<Accepted> {
    const existing = await store.get(p.channelId);
    // A replayed open (the client retried after a lost answer) is its voucher again.
    if (existing) return acceptVoucher(p, existing, source);
    checkAllowed(p.descriptor.payer);
    checkSource(source, p);
    if (p.authorizedSigner !== undefined && !same(p.authorizedSigner, p.descriptor.authorizedSigner)) {
      throw failed("authorized signer does not match the descriptor");
    }
    checkSignature(p.channelId, p.cumulativeAmount, p.signature, p);
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
    return acceptVoucher(p, raced, source);
  }

  /** "topUp": the channel must be known; broadcast, confirm TopUp, raise the deposit. */
  async function verifyTopUp(
    p: Extract<SessionPayload, { action: "topUp" }>,
    source: string | undefined,
    challengeId: string,
  ): Promise<{ accepted: bigint; receipt: string }> {
    const record = await loadOrAdopt(p, source);
    if (record.status !== "open") throw failed("channel is closing or closed");
    checkAllowed(record.descriptor.payer);
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
    stateCache.delete(p.channelId);
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
      at: now(),
    });
    return { accepted: after.highest.cumulative, receipt };
  }

  /** "close" pre-checks: signer from the stored descriptor, amount not below the spend. */
  async function checkClose(p: Extract<SessionPayload, { action: "close" }>, source: string | undefined) {
    const record = await loadOrAdopt(p, source);
    if (record.status === "closed") return record;
    checkSource(source, record);
    checkSignature(p.channelId, p.cumulativeAmount, p.signature, record);
    if (p.cumulativeAmount < maxOf(record.spent, record.settled)) {
      throw failed("close amount is below the channel's spent amount");
    }
    return record;
  }

  function closedReceipt(record: ChannelRecord, cumulative: bigint, challengeId: string): string {
    if (!record.closed || record.closed.cumulative !== cumulative) throw failed("channel is already closed");
    return sessionReceipt({
      challengeId,
      channelId: record.channelId,
      acceptedCumulative: record.closed.cumulative,
      spent: record.closed.captured,
      units: record.units,
      txHash: record.closed.txHash,
      at: now(),
    });
  }

  function channelIdOf(value: string, code: "mpp_reservation_failed" | "mpp_commit_failed"): Hex {
    if (!CHANNEL_ID.test(value)) throw new PaymentError(code, "channel id is malformed");
    return value.toLowerCase() as Hex;
  }

  return {
    challenge(req) {
      const priced = catalog.price(req);
      if (priced.quote <= 0n) {
        throw new PaymentError(
          "mpp_request_quote_invalid",
          "no positive quote could be derived for the request",
        );
      }
      if (priced.quote > s.bucket) {
        throw new PaymentError(
          "mpp_request_exceeds_voucher_bucket",
          "the request's quote exceeds the voucher bucket; send a smaller request",
        );
      }
      return issueChallenge(s, req, priced, now());
    },

    async verify(req) {
      const { verified, payload: p, source } = authenticate(req);
      const base = {
        action: p.action,
        channelId: p.channelId,
        challengeId: verified.challenge.id,
        binding: verified.binding,
        quote: verified.quote,
      };
      const acceptedAs = (a: Accepted) => ({
        ...base,
        acceptedCumulative: a.cumulative,
        acceptedReceipt: sessionReceipt({
          challengeId: verified.challenge.id,
          channelId: p.channelId,
          acceptedCumulative: a.cumulative,
          spent: a.spent,
          units: a.units,
          at: now(),
        }),
      });
      switch (p.action) {
        case "open":
          return acceptedAs(await verifyOpen(p, source));
        case "voucher":
          return acceptedAs(await acceptVoucher(p, await loadOrAdopt(p, source), source));
        case "topUp": {
          const { accepted, receipt } = await verifyTopUp(p, source, verified.challenge.id);
          return { ...base, acceptedCumulative: accepted, paymentReceipt: receipt };
        }
        case "close": {
          // Checked without acting on it; the caller sends it on to Close. A retried close of a
          // closed channel passes only when it repeats the recorded close amount.
          const record = await checkClose(p, source);
          if (record.status === "closed" && record.closed?.cumulative !== p.cumulativeAmount) {
            throw failed("channel is already closed");
          }
          return { ...base, acceptedCumulative: record.highest.cumulative };
        }
      }
    },

    async reserve(channelIdText, requestId, quoteText) {
      const quote = parseAmount(quoteText);
      if (quote === undefined || quote <= 0n) {
        throw new PaymentError("mpp_request_quote_invalid", "quote must be a positive amount of base units");
      }
      if (quote > s.bucket) {
        throw new PaymentError("mpp_request_exceeds_voucher_bucket", "the quote exceeds the voucher bucket");
      }
      const channelId = channelIdOf(channelIdText, "mpp_reservation_failed");
      // A retried Reserve of one request gets the same id, so it never holds twice. The request
      // id is api-edge's own fresh id per HTTP request (proto ReserveRequest.request_id): were
      // it a caller's, two requests naming it would share one hold, one commit and one receipt.
      const reservationId =
        requestId === ""
          ? `rsv_${randomBytes(16).toString("hex")}`
          : `rsv_${createHash("sha256").update(`${channelId}|${requestId}`).digest("hex").slice(0, 32)}`;
      const at = now();
      let outcome: Awaited<ReturnType<ChannelStore["reserve"]>>;
      try {
        outcome = await store.reserve(
          channelId,
          reservationId,
          quote,
          at,
          at + s.reservationTtlSeconds * 1000,
        );
      } catch (err) {
        log.error({ channel: channelTag(channelId), err }, "reserve failed");
        throw new PaymentError("mpp_reservation_failed", "the voucher authorization could not be reserved", {
          cause: err,
        });
      }
      switch (outcome) {
        case "reserved":
          return reservationId;
        case "insufficient":
          throw new PaymentError(
            "mpp_voucher_bucket_refresh_required",
            "the accepted voucher bucket cannot hold this request; sign a higher cumulative voucher",
          );
        case "not_open":
          throw new PaymentError("mpp_reservation_failed", "the session is closing or closed");
        case "unknown":
          throw new PaymentError("mpp_reservation_failed", "the session is unknown");
        case "conflict":
          throw new PaymentError("mpp_reservation_failed", "the request was already reserved and finished");
      }
    },

    async commit(reservationId, channelIdText, challengeId, actualCost) {
      const channelId = channelIdOf(channelIdText, "mpp_commit_failed");
      if (!RESERVATION_ID.test(reservationId))
        throw new PaymentError("mpp_commit_failed", "the reservation is unknown");
      const actual = parseAmount(actualCost);
      if (actual === undefined)
        throw new PaymentError("mpp_commit_failed", "actual cost must be an amount of base units");
      let outcome: Awaited<ReturnType<ChannelStore["commit"]>>;
      try {
        outcome = await store.commit(channelId, reservationId, actual, now());
      } catch (err) {
        log.error({ channel: channelTag(channelId), err }, "commit failed");
        throw new PaymentError("mpp_commit_failed", "paid usage could not be committed", { cause: err });
      }
      if (outcome.kind !== "committed") {
        const why = { unknown: "is unknown", released: "was released", expired: "has expired" }[outcome.kind];
        throw new PaymentError("mpp_commit_failed", `the reservation ${why}`);
      }
      await store.markDirty(channelId).catch((err: unknown) => {
        log.warn({ channel: channelTag(channelId), err }, "settlement mark failed");
      });
      return sessionReceipt({
        challengeId,
        channelId,
        acceptedCumulative: outcome.accepted,
        spent: outcome.spent,
        units: outcome.units,
        at: outcome.committedAt,
      });
    },

    async release(reservationId, channelIdText) {
      const channelId = channelIdOf(channelIdText, "mpp_reservation_failed");
      // An id this service never handed out holds nothing: releasing it changes nothing.
      if (!RESERVATION_ID.test(reservationId)) return;
      try {
        const outcome = await store.release(channelId, reservationId, now());
        if (outcome === "committed") {
          log.warn({ channel: channelTag(channelId) }, "release of a committed reservation ignored");
        }
      } catch (err) {
        log.error({ channel: channelTag(channelId), err }, "release failed");
        throw new PaymentError(
          "mpp_reservation_failed",
          "the hold could not be released; it expires on its own",
          {
            cause: err,
          },
        );
      }
    },

    async close(req) {
      const { verified, payload: p, source } = authenticate({ ...req, body: new Uint8Array() });
      if (p.action !== "close") throw failed("not a close credential");
      const challengeId = verified.challenge.id;
      const tag = channelTag(p.channelId);
      const cumulative = p.cumulativeAmount;
      const checked = await checkClose(p, source);
      if (checked.status === "closed") return closedReceipt(checked, cumulative, challengeId);
      if (!chain.canSend) {
        throw new PaymentError(
          "mpp_session_close_unavailable",
          "the close signer is not configured; the session stays open",
        );
      }
      let begun: Awaited<ReturnType<ChannelStore["beginClose"]>>;
      try {
        begun = await store.beginClose(p.channelId, now(), staleCloseMs);
      } catch (err) {
        log.error({ channel: tag, err }, "close mark failed");
        throw new PaymentError(
          "mpp_session_close_unavailable",
          "the close recorder is unreachable; the session stays open",
          {
            cause: err,
          },
        );
      }
      switch (begun.kind) {
        case "ok":
          break;
        case "closed": {
          const record = await store.get(p.channelId);
          if (!record) throw failed("channel is unknown");
          return closedReceipt(record, cumulative, challengeId);
        }
        case "closing":
          throw new PaymentError("mpp_session_close_failed", "a close of this session is already in flight");
        case "busy":
          throw new PaymentError("mpp_session_close_failed", "requests of this session are still in flight");
        case "unknown":
          throw failed("channel is unknown");
      }
      const { token, record } = begun;
      const abort = async (error: PaymentError) => {
        await store.abortClose(p.channelId, token).catch((err: unknown) => {
          log.error({ channel: tag, err }, "close rollback failed");
        });
        return error;
      };
      let capture = maxOf(record.spent, record.settled);
      if (cumulative < capture) throw await abort(failed("close amount is below the channel's spent amount"));
      let state: OnChainState;
      try {
        state = await chain.state(p.channelId);
      } catch (err) {
        log.warn({ channel: tag, cause: safeCause(err) }, "channel state read failed");
        throw await abort(
          new PaymentError("mpp_session_close_failed", "channel state could not be read from the chain"),
        );
      }
      capture = maxOf(capture, state.settled);
      if (state.deposit === 0n || capture > state.deposit || capture > cumulative) {
        throw await abort(
          new PaymentError("mpp_session_close_failed", "the channel cannot be closed at this amount"),
        );
      }
      let closed: { txHash: Hex; settledToPayee: bigint; refundedToPayer: bigint };
      try {
        closed = await chain.close(
          record.descriptor,
          p.channelId,
          { cumulative, signature: p.signature },
          capture,
        );
      } catch (err) {
        log.warn({ channel: tag, cause: safeCause(err) }, "close transaction failed");
        throw await abort(
          new PaymentError("mpp_session_close_failed", "the close transaction failed", { cause: err }),
        );
      }
      stateCache.delete(p.channelId);
      if (closed.settledToPayee > capture || closed.settledToPayee + closed.refundedToPayer > state.deposit) {
        log.error({ channel: tag }, "close event amounts differ from the requested capture");
      }
      try {
        await store.finishClose(p.channelId, {
          txHash: closed.txHash,
          cumulative,
          captured: closed.settledToPayee,
        });
      } catch (err) {
        log.error({ channel: tag, err }, "close record failed after the close transaction");
        throw new PaymentError("mpp_session_close_failed", "the close was sent but could not be recorded", {
          cause: err,
        });
      }
      await store.clearDirty(p.channelId).catch(() => undefined);
      log.info({ channel: tag }, "channel closed");
      return sessionReceipt({
        challengeId,
        channelId: p.channelId,
        acceptedCumulative: cumulative,
        spent: closed.settledToPayee,
        units: record.units,
        txHash: closed.txHash,
        at: now(),
      });
    },
  };
}
