import type { ErrorCodeOf } from "@tollgate/proto/errors";

/**
 * Every way the paid door can refuse a request inside mpp-payment, as packages/proto/src/errors.ts
 * holds them (docs/contract.md, "Errors"). `mpp_invalid_request` covers plan and model problems of
 * an unpaid request, which that table leaves without a code (api-edge answers 400).
 * `payment_required` and `mpp_streaming_unavailable` are decided by api-edge before it calls us.
 */
export type PaymentErrorCode = ErrorCodeOf<"mpp-payment">;

/**
 * The one error class of the payment domain. `message` is safe to return to the caller: it
 * never carries a credential, signature, address or amount of someone else's channel.
 */
export class PaymentError extends Error {
  constructor(
    readonly code: PaymentErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "PaymentError";
  }
}
