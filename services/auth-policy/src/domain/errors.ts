import type { RateScope, RateUnit } from "./ports.js";

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

/** The one error class of the auth domain. */
export class AuthError extends Error {
  constructor(
    readonly code: AuthErrorCode,
    message: string,
    /** Set for "rate_limited" only. */
    readonly rateLimit?: RateLimitInfo,
  ) {
    super(message);
    this.name = "AuthError";
  }
}
