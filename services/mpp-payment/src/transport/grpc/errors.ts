import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { isRedisUnavailable } from "@tollgate/kit/redis";
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

/**
 * Codes the domain gives a Reserve, Commit or Release whose store call failed. When it failed
 * only because Redis could not be reached, the answer is that outage, not a refusal.
 */
const STORE_CALL_CODES: ReadonlySet<PaymentErrorCode> = new Set([
  "mpp_reservation_failed",
  "mpp_commit_failed",
]);

/**
 * Turns a domain error into the status the bridge sends; anything else passes through (INTERNAL).
 * A Reserve, Commit or Release that failed because Redis was down or restarting passes its cause
 * on, which the bridge answers UNAVAILABLE (store_unavailable): api-edge answers a retryable 503
 * for a Reserve, and runs an idempotent Commit or Release again once Redis answers.
 */
export function toStatusError(err: unknown): unknown {
  if (!(err instanceof PaymentError)) return err;
  if (STORE_CALL_CODES.has(err.code) && isRedisUnavailable(err.cause)) return err.cause;
  return new StatusError(STATUS[err.code], err.code, err.message);
}
