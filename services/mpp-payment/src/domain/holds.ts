import { createHash, randomBytes } from "node:crypto";
import type { Hex } from "viem";
import { parseAmount } from "./amounts.js";
import type { PaymentContext } from "./context.js";
import { PaymentError } from "./errors.js";
import type { ChallengeUse, ChannelStore, ReserveOutcome } from "./ports.js";
import { sessionReceipt } from "./receipts.js";
import { channelTag } from "./safe-log.js";

const CHANNEL_ID = /^0x[0-9a-fA-F]{64}$/;
/** Reservation ids this service hands out (they become part of a store key). */
const RESERVATION_ID = /^rsv_[0-9a-f]{32}$/;

function channelIdOf(value: string, code: "mpp_reservation_failed" | "mpp_commit_failed"): Hex {
  if (!CHANNEL_ID.test(value)) throw new PaymentError(code, "channel id is malformed");
  return value.toLowerCase() as Hex;
}

/** A hold, and the receipt of the channel with it (before its cost; "" without a challenge id). */
export interface Reserved {
  reservationId: string;
  receipt: string;
}

/** A hold about to be taken: its channel, id, amount and lifetime, and the challenge it consumes. */
export interface HoldTerms {
  channelId: Hex;
  reservationId: string;
  quote: bigint;
  at: number;
  expiresAt: number;
  challenge?: ChallengeUse;
}

/**
 * How long a used mark outlives its challenge's expiry: a replica whose clock runs behind the
 * one that took the hold still takes the challenge for unexpired that long.
 */
export const USED_MARK_SKEW_MS = 60_000;
/** Challenge ids this service hands out (mppx: base64url of an HMAC); one becomes part of a store key. */
const CHALLENGE_ID = /^[A-Za-z0-9_-]{1,128}$/;

/**
 * The challenge a content request's hold consumes (docs/paid-door.md, "One challenge, one
 * request"): one challenge pays for one request, so a captured credential cannot be replayed.
 * It is remembered until `expires` (the challenge's, when Verify read it; else the latest a
 * challenge issued now could expire) plus USED_MARK_SKEW_MS; after that the challenge itself is
 * refused as expired. No challenge id (a Reserve without one): nothing to consume.
 */
export function challengeUse(
  ctx: PaymentContext,
  challengeId: string,
  expires?: number,
): ChallengeUse | undefined {
  if (challengeId === "") return undefined;
  if (!CHALLENGE_ID.test(challengeId))
    throw new PaymentError("mpp_invalid_challenge", "challenge id is malformed");
  const until = expires ?? ctx.now() + ctx.s.challengeTtlSeconds * 1000;
  return { id: challengeId, until: until + USED_MARK_SKEW_MS };
}

/** The refusal of a request presenting a challenge another request's hold consumed. */
export function challengeUsed(): PaymentError {
  return new PaymentError("mpp_invalid_challenge", "challenge was already used; obtain a new one");
}

/**
 * The terms of holding `quote` for `requestId`: the quote must be positive and within the
 * voucher bucket; the reservation id is derived from the channel and `requestId`, so a retry
 * with the same id gets the same hold.
 */
export function holdTerms(
  ctx: PaymentContext,
  channelIdText: string,
  requestId: string,
  quote: bigint | undefined,
  challenge?: ChallengeUse,
): HoldTerms {
  const { s } = ctx;
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
  const at = ctx.now();
  const expiresAt = at + s.reservationTtlSeconds * 1000;
  return { channelId, reservationId, quote, at, expiresAt, ...(challenge ? { challenge } : {}) };
}

/** The hold a store step took, with its receipt; or the refusal it answered. */
export function reservedOf(terms: HoldTerms, outcome: ReserveOutcome, challengeId: string): Reserved {
  const { channelId, reservationId, at } = terms;
  switch (outcome.kind) {
    case "reserved":
      return {
        reservationId,
        receipt:
          challengeId === ""
            ? ""
            : sessionReceipt({
                challengeId,
                channelId,
                acceptedCumulative: outcome.accepted,
                spent: outcome.spent,
                units: outcome.units,
                at,
              }),
      };
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
    case "used":
      throw challengeUsed();
  }
}

/**
 * Holds `quote` inside the channel's accepted cumulative; returns the reservation id, derived
 * from the channel and `requestId` (a retry with the same id gets the same hold), and the
 * receipt of the hold before its cost: the channel's committed spend, accepted cumulative and
 * committed requests read in the same step as the hold. Adding the request's charge (at most
 * `quote`) to its spent and one to its units gives the receipt of the answer (docs/paid-door.md,
 * "One round trip"): true once the hold is committed, and within the accepted cumulative, since
 * spent + the hold never exceeds it. Given a challenge id, the hold consumes that challenge
 * (challengeUse); a challenge that another request's hold consumed is refused
 * mpp_invalid_challenge, holding nothing. `expires` is the challenge's expiry when the caller
 * verified it.
 */
export async function reserve(
  ctx: PaymentContext,
  channelIdText: string,
  requestId: string,
  quoteText: string,
  challengeId = "",
  expires?: number,
): Promise<Reserved> {
  const { store, log } = ctx;
  const use = challengeUse(ctx, challengeId, expires);
  const terms = holdTerms(ctx, channelIdText, requestId, parseAmount(quoteText), use);
  const { channelId, reservationId, quote, at, expiresAt, challenge } = terms;
  let outcome: ReserveOutcome;
  try {
    outcome = await store.reserve(channelId, reservationId, quote, at, expiresAt, challenge);
  } catch (err) {
    log.error({ channel: channelTag(channelId), err }, "reserve failed");
    throw new PaymentError("mpp_reservation_failed", "the voucher authorization could not be reserved", {
      cause: err,
    });
  }
  return reservedOf(terms, outcome, challengeId);
}

/** Records the actual cost and returns the Payment-Receipt; only after the store update succeeded. */
export async function commit(
  ctx: PaymentContext,
  reservationId: string,
  channelIdText: string,
  challengeId: string,
  actualCost: string,
): Promise<string> {
  const { store, log } = ctx;
  const channelId = channelIdOf(channelIdText, "mpp_commit_failed");
  if (!RESERVATION_ID.test(reservationId))
    throw new PaymentError("mpp_commit_failed", "the reservation is unknown", { hold: "unknown" });
  const actual = parseAmount(actualCost);
  if (actual === undefined)
    throw new PaymentError("mpp_commit_failed", "actual cost must be an amount of base units");
  let outcome: Awaited<ReturnType<ChannelStore["commit"]>>;
  try {
    outcome = await store.commit(channelId, reservationId, actual, ctx.now());
  } catch (err) {
    log.error({ channel: channelTag(channelId), err }, "commit failed");
    throw new PaymentError("mpp_commit_failed", "paid usage could not be committed", { cause: err });
  }
  if (outcome.kind !== "committed") {
    const why = { unknown: "is unknown", released: "was released", expired: "has expired" }[outcome.kind];
    throw new PaymentError("mpp_commit_failed", `the reservation ${why}`, { hold: outcome.kind });
  }
  if (outcome.charged < actual) {
    // Never more than the hold (the request's quote): a cost above it names more than the request
    // could produce, a misbehaving or forged usage event (docs/kubernetes.md, "NATS and Redis are
    // trust boundaries").
    ctx.onOverHold({ actual, charged: outcome.charged });
    log.warn(
      {
        channel: channelTag(channelId),
        reservationId,
        actual: actual.toString(),
        charged: outcome.charged.toString(),
      },
      "commit above its hold: charged the hold",
    );
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
}

/** Returns a hold that will not be committed. */
export async function release(
  ctx: PaymentContext,
  reservationId: string,
  channelIdText: string,
): Promise<void> {
  const { store, log } = ctx;
  const channelId = channelIdOf(channelIdText, "mpp_reservation_failed");
  // An id this service never handed out holds nothing: releasing it changes nothing.
  if (!RESERVATION_ID.test(reservationId)) return;
  try {
    const outcome = await store.release(channelId, reservationId, ctx.now());
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
}
