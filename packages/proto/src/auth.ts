// Re-export of the generated tollgate.auth.v1 code (see proto/tollgate/auth/v1).
export * from "./gen/tollgate/auth/v1/auth_pb.js";

/**
 * Detail names of a `rate_limited` refusal (gRPC RESOURCE_EXHAUSTED). They travel as trailing
 * metadata `tollgate-<name>` and arrive in `RemoteError.details[<name>]`, each a decimal
 * string except scope and unit. api-edge turns them into `Retry-After` and `RateLimit-*`.
 */
export const RATE_LIMIT_DETAILS = {
  /** Whole seconds after which the same request would be admitted (at least 1). */
  retryAfter: "retry-after",
  /** Units the refusing window admits per minute. */
  limit: "ratelimit-limit",
  /** Units still available in that window. */
  remaining: "ratelimit-remaining",
  /** Seconds until every unit counted in that window has left it. */
  reset: "ratelimit-reset",
  /** "account", "connection", "key" or "route". */
  scope: "ratelimit-scope",
  /** "requests" or "tokens". */
  unit: "ratelimit-unit",
} as const;

/**
 * Detail names of a `budget_exceeded` refusal (gRPC FAILED_PRECONDITION; api-edge answers 402).
 * They travel like RATE_LIMIT_DETAILS; amounts are decimal strings of base units.
 */
export const BUDGET_DETAILS = {
  /** What is left of the refusing budget in its current period (never negative). */
  remaining: "budget-remaining",
  /** The refusing budget's amount per period. */
  limit: "budget-limit",
  /** The request's quote, which did not fit. */
  quote: "budget-quote",
  /** "connection" or "key". */
  scope: "budget-scope",
  /** Whole seconds until the period ends and the budget is whole again (at least 1). */
  reset: "budget-reset",
} as const;
