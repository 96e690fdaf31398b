import { type ErrorDetails, GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { BUDGET_DETAILS, RATE_LIMIT_DETAILS } from "@tollgate/proto/auth";
import { ERRORS } from "@tollgate/proto/errors";
import { AuthError, type AuthErrorCode, type BudgetInfo, type RateLimitInfo } from "../../domain/errors.js";

/** Each auth code's gRPC status, from the one error table (packages/proto/src/errors.ts). */
const statusOf = (code: AuthErrorCode): GrpcStatus => GrpcStatus[ERRORS[code].grpc];

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
  return new StatusError(statusOf(err.code), err.code, err.message, details);
}
