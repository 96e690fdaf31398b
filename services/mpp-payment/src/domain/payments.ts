import type { PaidRequest } from "./catalog.js";
import type { IssuedChallenge } from "./challenge.js";
import { close } from "./close.js";
import { createContext, type PaymentsDeps } from "./context.js";
import type { CredentialedRequest, Verified } from "./credential.js";
import { commit, type Reserved, release, reserve } from "./holds.js";
import { challenge } from "./issue.js";
import { type VerifiedAndHeld, verify, verifyAndReserve } from "./verify.js";

export type { PaymentsDeps } from "./context.js";
export type { CredentialedRequest, Verified } from "./credential.js";
export type { Reserved } from "./holds.js";
export type { VerifiedAndHeld } from "./verify.js";

/**
 * The paid door's payment operations (docs/architecture.md, "The paid door, one request"):
 * challenge issue (issue.ts), credential verification (credential.ts, verify.ts), holds
 * (holds.ts) and close (close.ts), over one shared context (context.ts).
 */
export interface Payments {
  /** Prices an unpaid request and builds its 402 challenge. */
  challenge(req: PaidRequest): IssuedChallenge;
  /** Verifies a credential; open and topUp are broadcast and confirmed on chain before this returns. */
  verify(req: CredentialedRequest): Promise<Verified>;
  /**
   * Verifies a credential and, when it pays for content, holds its quote for `requestId` (the
   * gateway's own per-request id) in the same call; no hold when it cannot be taken (verify.ts).
   */
  verifyAndReserve(req: CredentialedRequest, requestId: string): Promise<VerifiedAndHeld>;
  /**
   * Holds `quote` inside the channel's accepted cumulative; returns the reservation id, derived
   * from the channel and `requestId` (a retry with the same id gets the same hold), and, given
   * the verified challenge's id, the receipt of the hold before its cost (holds.ts); the hold
   * then consumes that challenge, and a challenge another request's hold consumed is refused
   * mpp_invalid_challenge (docs/paid-door.md, "One challenge, one request"). `requestId` must be
   * the gateway's own per-request id, never one a caller chose.
   */
  reserve(channelId: string, requestId: string, quote: string, challengeId?: string): Promise<Reserved>;
  /** Records the actual cost and returns the Payment-Receipt; only after the store update succeeded. */
  commit(reservationId: string, channelId: string, challengeId: string, actualCost: string): Promise<string>;
  /** Returns a hold that will not be committed. */
  release(reservationId: string, channelId: string): Promise<void>;
  /** Closes the channel on chain from a close credential; returns the close receipt. */
  close(req: CredentialedRequest): Promise<string>;
}

/** Builds the payment operations over a store and a chain. */
export function createPayments(deps: PaymentsDeps): Payments {
  const ctx = createContext(deps);
  return {
    challenge: (req) => challenge(ctx, req),
    verify: (req) => verify(ctx, req),
    verifyAndReserve: (req, requestId) => verifyAndReserve(ctx, req, requestId),
    reserve: (channelId, requestId, quote, challengeId) =>
      reserve(ctx, channelId, requestId, quote, challengeId),
    commit: (reservationId, channelId, challengeId, actualCost) =>
      commit(ctx, reservationId, channelId, challengeId, actualCost),
    release: (reservationId, channelId) => release(ctx, reservationId, channelId),
    close: (req) => close(ctx, req),
  };
}
