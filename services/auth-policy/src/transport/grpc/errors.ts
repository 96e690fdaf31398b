import { type ErrorDetails, GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { BUDGET_DETAILS, RATE_LIMIT_DETAILS } from "@tollgate/proto/auth";
import { AuthError, type AuthErrorCode, type BudgetInfo, type RateLimitInfo } from "../../domain/errors.js";

/** Each auth code's gRPC status, once and exhaustively. */
export const STATUS = {
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
  invalid_argument: GrpcStatus.INVALID_ARGUMENT,
  account_not_found: GrpcStatus.NOT_FOUND,
  connection_not_found: GrpcStatus.NOT_FOUND,
  key_not_found: GrpcStatus.NOT_FOUND,
  account_exists: GrpcStatus.ALREADY_EXISTS,
  connection_exists: GrpcStatus.ALREADY_EXISTS,
  key_not_active: GrpcStatus.FAILED_PRECONDITION,
  broadcast_failed: GrpcStatus.UNAVAILABLE,
} satisfies Record<AuthErrorCode, GrpcStatus>;

/** The numbers of a rate-limit refusal as error details (trailing metadata `tollgate-<name>`). */
function rateLimitDetails(r: RateLimitInfo): ErrorDetails {
  return {
    [RATE_LIMIT_DETAILS.retryAfter]: String(r.retryAfterSeconds),
    [RATE_LIMIT_DETAILS.limit]: String(r.limit),
    [RATE_LIMIT_DETAILS.remaining]: String(r.remaining),
    [RATE_LIMIT_DETAILS.reset]: String(r.resetSeconds),
    [RATE_LIMIT_DETAILS.scope]: r.scope,
    [RATE_LIMIT_DETAILS.unit]: r.unit,
  };
}

/** The numbers of a budget refusal as error details. */
function budgetDetails(b: BudgetInfo): ErrorDetails {
  return {
    [BUDGET_DETAILS.remaining]: b.remaining.toString(),
    [BUDGET_DETAILS.limit]: b.limit.toString(),
    [BUDGET_DETAILS.quote]: b.quote.toString(),
    [BUDGET_DETAILS.scope]: b.scope,
    [BUDGET_DETAILS.reset]: String(b.resetSeconds),
  };
}

/** Turns a domain error into the status the bridge sends; anything else passes through. */
export function toStatusError(err: unknown): unknown {
  if (!(err instanceof AuthError)) return err;
  const details = {
    ...(err.rateLimit ? rateLimitDetails(err.rateLimit) : {}),
    ...(err.budget ? budgetDetails(err.budget) : {}),
  };
  return new StatusError(STATUS[err.code], err.code, err.message, details);
}
