import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { isRedisUnavailable } from "@tollgate/kit/redis";
import { ERRORS } from "@tollgate/proto/errors";
import { PaymentError, type PaymentErrorCode } from "../../domain/errors.js";

/**
 * Each payment code's gRPC status, from the one error table (packages/proto/src/errors.ts). The
 * code itself travels in the trailing metadata (kit's StatusError); api-edge turns it into the
 * spec's HTTP answer.
 */
const statusOf = (code: PaymentErrorCode): GrpcStatus => GrpcStatus[ERRORS[code].grpc];

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
 * for a Reserve, and runs an idempotent Commit or Release again once Redis answers. A Commit
 * refused because its hold is unknown, released or expired says which in the detail `hold`
 * (trailing metadata `tollgate-hold`): metering acknowledges that usage event instead of retrying it.
 */
export function toStatusError(err: unknown): unknown {
  if (!(err instanceof PaymentError)) return err;
  if (STORE_CALL_CODES.has(err.code) && isRedisUnavailable(err.cause)) return err.cause;
  return new StatusError(statusOf(err.code), err.code, err.message, err.hold ? { hold: err.hold } : {});
}
