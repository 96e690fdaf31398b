import type { ErrorCodeOf } from "@tollgate/proto/errors";

/**
 * Every way the paid door can refuse a request inside mpp-payment, as packages/proto/src/errors.ts
 * holds them (docs/contract.md, "Errors"). `mpp_invalid_request` covers plan and model problems of
 * an unpaid request, which that table leaves without a code (api-edge answers 400).
 * `payment_required` and `mpp_streaming_unavailable` are decided by api-edge before it calls us.
 */
export type PaymentErrorCode = ErrorCodeOf<"mpp-payment">;

/**
 * Why a Commit found no hold to charge: none was taken under that id (or it was forgotten), it
 * was given back, or it lapsed with its TTL. Nothing the caller retries can change it.
 */
export type FinishedHold = "unknown" | "released" | "expired";

/**
 * The one error class of the payment domain. `message` is safe to return to the caller: it
 * never carries a credential, signature, address or amount of someone else's channel. `hold`
 * says why a Commit refused (it travels as the error detail `hold`), so that a caller can tell
 * a hold that will never be charged from a commit that failed.
 */
export class PaymentError extends Error {
  readonly hold: FinishedHold | undefined;
  constructor(
    readonly code: PaymentErrorCode,
    message: string,
    options?: { cause?: unknown; hold?: FinishedHold },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "PaymentError";
    this.hold = options?.hold;
  }
}
