import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { describe, expect, it } from "vitest";
import { PaymentError, type PaymentErrorCode } from "../../domain/errors.js";
import { toStatusError } from "./errors.js";

const EXPECTED: Record<PaymentErrorCode, GrpcStatus> = {
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
};

describe("toStatusError", () => {
  for (const [code, status] of Object.entries(EXPECTED) as [PaymentErrorCode, GrpcStatus][]) {
    it(`sends ${code} as ${GrpcStatus[status]} with its code and message`, () => {
      const out = toStatusError(new PaymentError(code, `message for ${code}`));
      expect(out).toBeInstanceOf(StatusError);
      expect(out).toMatchObject({ status, code, message: `message for ${code}` });
    });
  }

  it("passes anything else through untouched", () => {
    const err = new Error("boom");
    expect(toStatusError(err)).toBe(err);
  });
});
