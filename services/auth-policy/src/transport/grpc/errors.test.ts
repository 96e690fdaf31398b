import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { BUDGET_DETAILS, RATE_LIMIT_DETAILS } from "@tollgate/proto/auth";
import { describe, expect, it } from "vitest";
import { AuthError, type AuthErrorCode } from "../../domain/errors.js";
import { toStatusError } from "./errors.js";

// Written out again on purpose: a change of mapping must be a deliberate change of this table.
const EXPECTED: Record<AuthErrorCode, GrpcStatus> = {
  missing_api_key: GrpcStatus.UNAUTHENTICATED,
  invalid_api_key: GrpcStatus.UNAUTHENTICATED,
  expired_api_key: GrpcStatus.UNAUTHENTICATED,
  revoked_api_key: GrpcStatus.UNAUTHENTICATED,
  rotated_api_key: GrpcStatus.UNAUTHENTICATED,
  model_not_allowed: GrpcStatus.PERMISSION_DENIED,
  output_cap_above_policy: GrpcStatus.PERMISSION_DENIED,
  route_not_allowed: GrpcStatus.PERMISSION_DENIED,
  tokens_above_rate_limit: GrpcStatus.PERMISSION_DENIED,
  rate_limited: GrpcStatus.RESOURCE_EXHAUSTED,
  budget_exceeded: GrpcStatus.FAILED_PRECONDITION,
  model_cannot_reason: GrpcStatus.INVALID_ARGUMENT,
  model_kind_mismatch: GrpcStatus.INVALID_ARGUMENT,
  invalid_argument: GrpcStatus.INVALID_ARGUMENT,
  account_not_found: GrpcStatus.NOT_FOUND,
  connection_not_found: GrpcStatus.NOT_FOUND,
  key_not_found: GrpcStatus.NOT_FOUND,
  account_exists: GrpcStatus.ALREADY_EXISTS,
  connection_exists: GrpcStatus.ALREADY_EXISTS,
  key_not_active: GrpcStatus.FAILED_PRECONDITION,
  budget_period_change: GrpcStatus.FAILED_PRECONDITION,
  broadcast_failed: GrpcStatus.UNAVAILABLE,
};

describe("toStatusError", () => {
  for (const [code, status] of Object.entries(EXPECTED) as [AuthErrorCode, GrpcStatus][]) {
    it(`sends ${code} as ${GrpcStatus[status]} with its code and message`, () => {
      const out = toStatusError(new AuthError(code, `message for ${code}`));
      expect(out).toBeInstanceOf(StatusError);
      expect(out).toMatchObject({ status, code, message: `message for ${code}`, details: {} });
    });
  }

  it("attaches the numbers of a rate-limit refusal as details", () => {
    const out = toStatusError(
      new AuthError("rate_limited", "slow down", {
        limit: 10,
        remaining: 0,
        resetSeconds: 58,
        retryAfterSeconds: 3,
        scope: "key",
        unit: "requests",
      }),
    ) as StatusError;
    expect(out.details).toEqual({
      [RATE_LIMIT_DETAILS.retryAfter]: "3",
      [RATE_LIMIT_DETAILS.limit]: "10",
      [RATE_LIMIT_DETAILS.remaining]: "0",
      [RATE_LIMIT_DETAILS.reset]: "58",
      [RATE_LIMIT_DETAILS.scope]: "key",
      [RATE_LIMIT_DETAILS.unit]: "requests",
    });
  });

  it("attaches the numbers of a budget refusal as details, amounts exact", () => {
    const out = toStatusError(
      new AuthError("budget_exceeded", "over budget", undefined, {
        scope: "connection",
        limit: 9_007_199_254_740_991n,
        remaining: 12n,
        quote: 13n,
        resetSeconds: 3_600,
      }),
    ) as StatusError;
    expect(out).toMatchObject({ status: GrpcStatus.FAILED_PRECONDITION, code: "budget_exceeded" });
    expect(out.details).toEqual({
      [BUDGET_DETAILS.remaining]: "12",
      [BUDGET_DETAILS.limit]: "9007199254740991",
      [BUDGET_DETAILS.quote]: "13",
      [BUDGET_DETAILS.scope]: "connection",
      [BUDGET_DETAILS.reset]: "3600",
    });
  });

  it("passes anything else through untouched", () => {
    const err = new Error("boom");
    expect(toStatusError(err)).toBe(err);
    expect(toStatusError("text")).toBe("text");
  });
});
