import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { PaymentError, type PaymentErrorCode } from "../../domain/errors.js";

/**
 * Each payment code's gRPC status, once and exhaustively. The code itself travels in the
 * trailing metadata (kit's StatusError); api-edge turns it into the spec's HTTP answer.
 */
export const STATUS = {
  mpp_invalid_request: GrpcStatus.INVALID_ARGUMENT,
  mpp_malformed_credential: GrpcStatus.INVALID_ARGUMENT,
  mpp_method_unsupported: GrpcStatus.INVALID_ARGUMENT,
  mpp_body_digest_mismatch: GrpcStatus.INVALID_ARGUMENT,
  mpp_request_quote_invalid: GrpcStatus.INVALID_ARGUMENT,
  mpp_request_exceeds_voucher_bucket: GrpcStatus.INVALID_ARGUMENT,
  mpp_invalid_challenge: GrpcStatus.UNAUTHENTICATED,
  mpp_payment_verification_failed: GrpcStatus.UNAUTHENTICATED,
  mpp_payer_not_allowed: GrpcStatus.PERMISSION_DENIED,
  mpp_session_deposit_below_request_cost: GrpcStatus.FAILED_PRECONDITION,
  mpp_voucher_bucket_refresh_required: GrpcStatus.FAILED_PRECONDITION,
  mpp_reservation_failed: GrpcStatus.ABORTED,
  mpp_commit_failed: GrpcStatus.INTERNAL,
  mpp_session_close_unavailable: GrpcStatus.UNAVAILABLE,
  mpp_session_close_failed: GrpcStatus.ABORTED,
} satisfies Record<PaymentErrorCode, GrpcStatus>;

/** Turns a domain error into the status the bridge sends; anything else passes through (INTERNAL). */
export function toStatusError(err: unknown): unknown {
  return err instanceof PaymentError ? new StatusError(STATUS[err.code], err.code, err.message) : err;
}
