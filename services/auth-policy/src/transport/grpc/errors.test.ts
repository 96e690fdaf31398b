import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { describe, expect, it } from "vitest";
import { AuthError, type AuthErrorCode } from "../../domain/errors.js";
import { toStatusError } from "./errors.js";

const EXPECTED: Record<AuthErrorCode, GrpcStatus> = {
  missing_api_key: GrpcStatus.UNAUTHENTICATED,
  invalid_api_key: GrpcStatus.UNAUTHENTICATED,
  expired_api_key: GrpcStatus.UNAUTHENTICATED,
  revoked_api_key: GrpcStatus.UNAUTHENTICATED,
  model_not_allowed: GrpcStatus.PERMISSION_DENIED,
  output_cap_above_policy: GrpcStatus.PERMISSION_DENIED,
};

describe("toStatusError", () => {
  for (const [code, status] of Object.entries(EXPECTED) as [AuthErrorCode, GrpcStatus][]) {
    it(`sends ${code} as ${GrpcStatus[status]} with its code and message`, () => {
      const out = toStatusError(new AuthError(code, `message for ${code}`));
      expect(out).toBeInstanceOf(StatusError);
      expect(out).toMatchObject({ status, code, message: `message for ${code}` });
    });
  }

  it("passes anything else through untouched", () => {
    const err = new Error("boom");
    expect(toStatusError(err)).toBe(err);
    expect(toStatusError("text")).toBe("text");
  });
});
