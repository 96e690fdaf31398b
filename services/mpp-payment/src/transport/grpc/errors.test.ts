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

  for (const code of ["mpp_reservation_failed", "mpp_commit_failed"] as const) {
    it(`passes on the Redis outage behind ${code}, which the bridge answers UNAVAILABLE`, () => {
      const cause = new Error("Connection is closed.");
      expect(toStatusError(new PaymentError(code, "store call failed", { cause }))).toBe(cause);
    });
  }

  it("keeps the code of a store failure that is no outage, and of a close that could not be recorded", () => {
    const wrong = new Error("ERR wrong number of arguments");
    expect(toStatusError(new PaymentError("mpp_commit_failed", "failed", { cause: wrong }))).toMatchObject({
      status: GrpcStatus.INTERNAL,
      code: "mpp_commit_failed",
    });
    const closed = new Error("Connection is closed.");
    expect(
      toStatusError(new PaymentError("mpp_session_close_unavailable", "unreachable", { cause: closed })),
    ).toMatchObject({ status: GrpcStatus.UNAVAILABLE, code: "mpp_session_close_unavailable" });
  });

  it("names the hold a Commit found unknown, released or expired in the detail `hold`, and no other", () => {
    for (const hold of ["unknown", "released", "expired"] as const) {
      expect(
        toStatusError(new PaymentError("mpp_commit_failed", "the reservation is gone", { hold })),
      ).toMatchObject({ status: GrpcStatus.INTERNAL, code: "mpp_commit_failed", details: { hold } });
    }
    expect(toStatusError(new PaymentError("mpp_commit_failed", "failed"))).toMatchObject({ details: {} });
  });

  it("passes anything else through untouched", () => {
    const err = new Error("boom");
    expect(toStatusError(err)).toBe(err);
  });
});
