import type { ErrorCodeOf } from "@tollgate/proto/errors";
import type { BudgetScope, RateScope, RateUnit } from "./types.js";

/** Every way auth-policy can refuse: an account-door request, or an admin call (packages/proto/src/errors.ts). */
export type AuthErrorCode = ErrorCodeOf<"auth-policy">;

/** The numbers of a rate-limit refusal: enough for Retry-After and RateLimit-* headers. */
export interface RateLimitInfo {
  /** Units the refusing window admits per minute. */
  limit: number;
  /** Units still available in it. */
  remaining: number;
  /** Seconds until every unit it counts has left it. */
  resetSeconds: number;
  /** Seconds after which the same request fits (at least 1). */
  retryAfterSeconds: number;
  scope: RateScope;
  unit: RateUnit;
}

/** The numbers of a budget refusal. */
export interface BudgetInfo {
  scope: BudgetScope;
  /** The budget's amount per period. */
  limit: bigint;
  /** Left in the current period: amount − spent − held, never below zero. */
  remaining: bigint;
  /** The request's quote, which did not fit. */
  quote: bigint;
  /** Seconds until the period ends and the budget is whole again (at least 1). */
  resetSeconds: number;
}

/** The one error class of the auth domain. */
export class AuthError extends Error {
  constructor(
    readonly code: AuthErrorCode,
    message: string,
    /** Set for "rate_limited" only. */
    readonly rateLimit?: RateLimitInfo,
    /** Set for "budget_exceeded" only. */
    readonly budget?: BudgetInfo,
  ) {
    super(message);
    this.name = "AuthError";
  }
}
