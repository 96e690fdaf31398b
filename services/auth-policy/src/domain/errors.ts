import type { BudgetScope, RateScope, RateUnit } from "./types.js";

/** Every way auth-policy can refuse: an account-door request, or an admin call. */
export type AuthErrorCode =
  // Authorize: 401
  | "missing_api_key"
  | "invalid_api_key"
  | "expired_api_key"
  | "revoked_api_key"
  | "rotated_api_key"
  // Authorize: 403
  | "model_not_allowed"
  | "output_cap_above_policy"
  | "route_not_allowed"
  | "tokens_above_rate_limit"
  // Authorize: 429
  | "rate_limited"
  // Authorize: 402
  | "budget_exceeded"
  // Authorize: 400
  | "model_cannot_reason"
  // Admin
  | "invalid_argument"
  | "account_not_found"
  | "connection_not_found"
  | "key_not_found"
  | "account_exists"
  | "connection_exists"
  | "key_not_active"
  | "broadcast_failed";

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
