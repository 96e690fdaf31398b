/**
 * Every way the paid door can refuse a request inside mpp-payment. The mpp_* codes are the
 * paid door's error table (docs/contract.md, "Errors"); `mpp_invalid_request` covers plan and
 * model problems of an unpaid request, which that table leaves without a code (api-edge answers
 * 400).
 * `payment_required` and `mpp_streaming_unavailable` are decided by api-edge before it calls us.
 */
export type PaymentErrorCode =
  | "mpp_invalid_request"
  | "mpp_malformed_credential"
  | "mpp_method_unsupported"
  | "mpp_invalid_challenge"
  | "mpp_body_digest_mismatch"
  | "mpp_request_quote_invalid"
  | "mpp_request_exceeds_voucher_bucket"
  | "mpp_payment_verification_failed"
  | "mpp_payer_not_allowed"
  | "mpp_session_deposit_below_request_cost"
  | "mpp_voucher_bucket_refresh_required"
  | "mpp_reservation_failed"
  | "mpp_commit_failed"
  | "mpp_session_close_unavailable"
  | "mpp_session_close_failed";

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
