/**
 * Every error code Tollgate answers, once: who raises it, the gRPC status it travels with
 * between services, the HTTP status and OpenAI error `type` api-edge answers, and whether the
 * caller may send the same request again. Each service's code union is a filter of this table
 * and each mapping reads it, so a code is added here and nowhere else
 * (docs/how-to/add-an-error-code.md).
 */

/** The services that raise codes. api-edge's own codes never cross gRPC. */
export type ErrorOwner = "api-edge" | "auth-policy" | "mpp-payment" | "inference-router" | "metering";

/**
 * Where api-edge answers a code: `account` and `paid` are the doors whose error tables in
 * docs/account-door.md and docs/paid-door.md list it (checked by errors.test.ts), `admin` the admin API, which answers only
 * these codes.
 */
export type ErrorDoor = "account" | "paid" | "admin";

/** gRPC status names, as `@grpc/grpc-js`'s `status` enum (kit's `GrpcStatus`) spells them. */
export type GrpcStatusName =
  | "OK"
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

/** OpenAI error types, plus the two of our own (402s). */
export type OpenAiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "conflict_error"
  | "rate_limit_error"
  | "server_error"
  | "payment_required"
  | "insufficient_budget";

export interface ErrorSpec {
  /** The services that raise it (a code two services raise means the same to the caller). */
  readonly owners: readonly ErrorOwner[];
  /** Its gRPC status when a service sends it; null for api-edge's own codes. */
  readonly grpc: GrpcStatusName | null;
  /** The HTTP status api-edge answers; null when no HTTP caller ever sees it. */
  readonly http: number | null;
  readonly type: OpenAiErrorType | null;
  /** The same request, sent again later (with backoff, or after Retry-After), may succeed. */
  readonly retryable: boolean;
  readonly doors: readonly ErrorDoor[];
}

export const ERRORS = {
  // api-edge: the caller's request, before any service is asked
  missing_api_key: {
    owners: ["api-edge", "auth-policy"],
    grpc: "UNAUTHENTICATED",
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account"],
  },
  wrong_auth_scheme: {
    owners: ["api-edge"],
    grpc: null,
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account", "paid"],
  },
  wrong_auth_field: {
    owners: ["api-edge"],
    grpc: null,
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account"],
  },
  invalid_json: {
    owners: ["api-edge"],
    grpc: null,
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid", "admin"],
  },
  json_too_deep: {
    owners: ["api-edge"],
    grpc: null,
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid", "admin"],
  },
  invalid_request: {
    owners: ["api-edge", "inference-router"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid", "admin"],
  },
  unsupported_media_type: {
    owners: ["api-edge"],
    grpc: null,
    http: 415,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid", "admin"],
  },
  payload_too_large: {
    owners: ["api-edge"],
    grpc: null,
    http: 413,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid", "admin"],
  },
  not_found: {
    owners: ["api-edge"],
    grpc: null,
    http: 404,
    type: "not_found_error",
    retryable: false,
    doors: ["account", "admin"],
  },
  method_not_allowed: {
    owners: ["api-edge"],
    grpc: null,
    http: 405,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid"],
  },
  expectation_failed: {
    owners: ["api-edge"],
    grpc: null,
    http: 417,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid"],
  },
  request_timeout: {
    owners: ["api-edge"],
    grpc: null,
    http: 408,
    type: "invalid_request_error",
    retryable: true,
    doors: ["account", "paid", "admin"],
  },
  headers_too_large: {
    owners: ["api-edge"],
    grpc: null,
    http: 431,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid", "admin"],
  },
  idempotency_key_invalid: {
    owners: ["api-edge"],
    grpc: null,
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account"],
  },
  idempotency_unsupported_for_streams: {
    owners: ["api-edge"],
    grpc: null,
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account"],
  },
  idempotency_key_reused: {
    owners: ["api-edge"],
    grpc: null,
    http: 422,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account"],
  },
  idempotency_in_progress: {
    owners: ["api-edge"],
    grpc: null,
    http: 409,
    type: "conflict_error",
    retryable: true,
    doors: ["account"],
  },
  payment_required: {
    owners: ["api-edge"],
    grpc: null,
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  mpp_streaming_unavailable: {
    owners: ["api-edge"],
    grpc: null,
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["paid"],
  },
  // api-edge: a service behind it failed without a code of this table (the cause is logged)
  internal_error: {
    owners: ["api-edge"],
    grpc: null,
    http: 500,
    type: "server_error",
    retryable: false,
    doors: ["account", "paid"],
  },
  service_unavailable: {
    owners: ["api-edge"],
    grpc: null,
    http: 503,
    type: "server_error",
    retryable: true,
    doors: ["account", "paid"],
  },
  gateway_timeout: {
    owners: ["api-edge"],
    grpc: null,
    http: 504,
    type: "server_error",
    retryable: true,
    doors: ["account", "paid"],
  },
  // The caller went away: logged, nobody reads the answer.
  client_closed_request: {
    owners: ["api-edge"],
    grpc: null,
    http: 499,
    type: "server_error",
    retryable: false,
    doors: [],
  },
  // api-edge's admin API
  missing_admin_token: {
    owners: ["api-edge"],
    grpc: null,
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["admin"],
  },
  invalid_admin_token: {
    owners: ["api-edge"],
    grpc: null,
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["admin"],
  },

  // auth-policy: Authorize
  invalid_api_key: {
    owners: ["auth-policy"],
    grpc: "UNAUTHENTICATED",
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account"],
  },
  expired_api_key: {
    owners: ["auth-policy"],
    grpc: "UNAUTHENTICATED",
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account"],
  },
  revoked_api_key: {
    owners: ["auth-policy"],
    grpc: "UNAUTHENTICATED",
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account"],
  },
  rotated_api_key: {
    owners: ["auth-policy"],
    grpc: "UNAUTHENTICATED",
    http: 401,
    type: "authentication_error",
    retryable: false,
    doors: ["account"],
  },
  model_not_allowed: {
    owners: ["auth-policy"],
    grpc: "PERMISSION_DENIED",
    http: 403,
    type: "permission_error",
    retryable: false,
    doors: ["account"],
  },
  output_cap_above_policy: {
    owners: ["auth-policy"],
    grpc: "PERMISSION_DENIED",
    http: 403,
    type: "permission_error",
    retryable: false,
    doors: ["account"],
  },
  route_not_allowed: {
    owners: ["auth-policy"],
    grpc: "PERMISSION_DENIED",
    http: 403,
    type: "permission_error",
    retryable: false,
    doors: ["account"],
  },
  tokens_above_rate_limit: {
    owners: ["auth-policy"],
    grpc: "PERMISSION_DENIED",
    http: 403,
    type: "permission_error",
    retryable: false,
    doors: ["account"],
  },
  rate_limited: {
    owners: ["auth-policy"],
    grpc: "RESOURCE_EXHAUSTED",
    http: 429,
    type: "rate_limit_error",
    retryable: true,
    doors: ["account"],
  },
  // The account door's 402 is about a budget, not a payment.
  budget_exceeded: {
    owners: ["auth-policy"],
    grpc: "FAILED_PRECONDITION",
    http: 402,
    type: "insufficient_budget",
    retryable: false,
    doors: ["account"],
  },
  model_cannot_reason: {
    owners: ["auth-policy", "inference-router"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account"],
  },
  // A chat model named on the embeddings route, or an embedding model on a chat-shaped route.
  model_kind_mismatch: {
    owners: ["auth-policy", "inference-router"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account"],
  },
  // auth-policy: admin RPCs
  invalid_argument: {
    owners: ["auth-policy"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["admin"],
  },
  account_not_found: {
    owners: ["auth-policy"],
    grpc: "NOT_FOUND",
    http: 404,
    type: "not_found_error",
    retryable: false,
    doors: ["admin"],
  },
  connection_not_found: {
    owners: ["auth-policy"],
    grpc: "NOT_FOUND",
    http: 404,
    type: "not_found_error",
    retryable: false,
    doors: ["admin"],
  },
  key_not_found: {
    owners: ["auth-policy"],
    grpc: "NOT_FOUND",
    http: 404,
    type: "not_found_error",
    retryable: false,
    doors: ["admin"],
  },
  account_exists: {
    owners: ["auth-policy"],
    grpc: "ALREADY_EXISTS",
    http: 409,
    type: "conflict_error",
    retryable: false,
    doors: ["admin"],
  },
  connection_exists: {
    owners: ["auth-policy"],
    grpc: "ALREADY_EXISTS",
    http: 409,
    type: "conflict_error",
    retryable: false,
    doors: ["admin"],
  },
  // Rotating a revoked, expired or already rotated key: the key's state conflicts.
  key_not_active: {
    owners: ["auth-policy"],
    grpc: "FAILED_PRECONDITION",
    http: 409,
    type: "conflict_error",
    retryable: false,
    doors: ["admin"],
  },
  // Changing a budget's period in place would count the new period from zero, forgetting what
  // was spent in it so far (docs/money.md, "Budget periods"): the budget's state conflicts.
  budget_period_change: {
    owners: ["auth-policy"],
    grpc: "FAILED_PRECONDITION",
    http: 409,
    type: "conflict_error",
    retryable: false,
    doors: ["admin"],
  },
  // The state changed but caches may not know yet; the message tells the caller to retry.
  broadcast_failed: {
    owners: ["auth-policy"],
    grpc: "UNAVAILABLE",
    http: 503,
    type: "server_error",
    retryable: true,
    doors: ["admin"],
  },

  // mpp-payment: the spec's MPP error table ("Errors" → "MPP route"); 402 wherever the client
  // should pay or re-sign. mpp_invalid_request: plan and model problems of an unpaid request.
  mpp_invalid_request: {
    owners: ["mpp-payment"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_malformed_credential: {
    owners: ["mpp-payment"],
    grpc: "INVALID_ARGUMENT",
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  mpp_method_unsupported: {
    owners: ["mpp-payment"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_invalid_challenge: {
    owners: ["mpp-payment"],
    grpc: "UNAUTHENTICATED",
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  mpp_body_digest_mismatch: {
    owners: ["mpp-payment"],
    grpc: "INVALID_ARGUMENT",
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  mpp_request_quote_invalid: {
    owners: ["mpp-payment"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_request_exceeds_voucher_bucket: {
    owners: ["mpp-payment"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_payment_verification_failed: {
    owners: ["mpp-payment"],
    grpc: "UNAUTHENTICATED",
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  mpp_payer_not_allowed: {
    owners: ["mpp-payment"],
    grpc: "PERMISSION_DENIED",
    http: 403,
    type: "permission_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_session_deposit_below_request_cost: {
    owners: ["mpp-payment"],
    grpc: "FAILED_PRECONDITION",
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  mpp_voucher_bucket_refresh_required: {
    owners: ["mpp-payment"],
    grpc: "FAILED_PRECONDITION",
    http: 402,
    type: "payment_required",
    retryable: false,
    doors: ["paid"],
  },
  // The spec's "stop and surface" codes: not retried blindly.
  mpp_reservation_failed: {
    owners: ["mpp-payment"],
    grpc: "ABORTED",
    http: 503,
    type: "server_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_commit_failed: {
    owners: ["mpp-payment", "api-edge"],
    grpc: "INTERNAL",
    http: 500,
    type: "server_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_session_close_unavailable: {
    owners: ["mpp-payment"],
    grpc: "UNAVAILABLE",
    http: 503,
    type: "server_error",
    retryable: false,
    doors: ["paid"],
  },
  mpp_session_close_failed: {
    owners: ["mpp-payment"],
    grpc: "ABORTED",
    http: 502,
    type: "server_error",
    retryable: false,
    doors: ["paid"],
  },

  // inference-router
  upstream_rejected: {
    owners: ["inference-router"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["account", "paid"],
  },
  model_not_found: {
    owners: ["inference-router"],
    grpc: "NOT_FOUND",
    http: 503,
    type: "server_error",
    retryable: true,
    doors: ["account", "paid"],
  },
  upstream_error: {
    owners: ["inference-router"],
    grpc: "UNAVAILABLE",
    http: 502,
    type: "server_error",
    retryable: true,
    doors: ["account", "paid"],
  },
  upstream_timeout: {
    owners: ["inference-router"],
    grpc: "DEADLINE_EXCEEDED",
    http: 504,
    type: "server_error",
    retryable: true,
    doors: ["account", "paid"],
  },
  usage_not_recorded: {
    owners: ["inference-router"],
    grpc: "UNAVAILABLE",
    http: 503,
    type: "server_error",
    retryable: true,
    doors: ["account", "paid"],
  },

  // metering: GetUsage (through the admin API), and usage events no HTTP caller sends
  invalid_time_range: {
    owners: ["api-edge", "metering"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["admin"],
  },
  time_range_too_large: {
    owners: ["metering"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["admin"],
  },
  invalid_granularity: {
    owners: ["metering"],
    grpc: "INVALID_ARGUMENT",
    http: 400,
    type: "invalid_request_error",
    retryable: false,
    doors: ["admin"],
  },
  invalid_usage_event: {
    owners: ["metering"],
    grpc: "INVALID_ARGUMENT",
    http: null,
    type: null,
    retryable: false,
    doors: [],
  },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERRORS;

/** The codes `owner` raises: each service's error code union. */
export type ErrorCodeOf<O extends ErrorOwner> = {
  [C in ErrorCode]: O extends (typeof ERRORS)[C]["owners"][number] ? C : never;
}[ErrorCode];

/** The codes api-edge answers on `door`. */
export type ErrorCodeOn<D extends ErrorDoor> = {
  [C in ErrorCode]: D extends (typeof ERRORS)[C]["doors"][number] ? C : never;
}[ErrorCode];

/** The codes an HTTP caller can be answered (every code but the event-only ones). */
export type HttpErrorCode = {
  [C in ErrorCode]: (typeof ERRORS)[C]["http"] extends number ? C : never;
}[ErrorCode];

/** Whether `code` is a code of this table (a newer service may send one this build lacks). */
export function isErrorCode(code: string | undefined): code is ErrorCode {
  return code !== undefined && Object.hasOwn(ERRORS, code);
}

/** Whether `code` is one that `owner` raises, at run time (`code` from the wire). */
export function isCodeOf<O extends ErrorOwner>(owner: O, code: string | undefined): code is ErrorCodeOf<O> {
  return isErrorCode(code) && (ERRORS[code].owners as readonly ErrorOwner[]).includes(owner);
}
