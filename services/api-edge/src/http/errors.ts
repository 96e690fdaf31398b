import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { isRedisUnavailable } from "@tollgate/kit/redis";
import { BUDGET_DETAILS, RATE_LIMIT_DETAILS } from "@tollgate/proto/auth";
import { INFERENCE_DETAILS } from "@tollgate/proto/inference";
import type { FastifyBaseLogger } from "fastify";
import { EdgeError } from "../domain/errors.js";

/** An OpenAI-style error as the caller sees it. */
export interface HttpError {
  status: number;
  type: string;
  code: string;
  message: string;
  /** Extra response headers (Retry-After and RateLimit-* on a 429). */
  headers?: Record<string, string>;
}

const TYPE_BY_STATUS: Record<number, string> = {
  409: "conflict_error",
  422: "invalid_request_error",
  410: "invalid_request_error",
  400: "invalid_request_error",
  401: "authentication_error",
  402: "payment_required",
  403: "permission_error",
  404: "not_found_error",
  405: "invalid_request_error",
  408: "invalid_request_error",
  413: "invalid_request_error",
  415: "invalid_request_error",
  431: "invalid_request_error",
  429: "rate_limit_error",
};

/** Error types that differ from their status's: the account door's 402 is about a budget. */
const TYPE_BY_CODE: Record<string, string> = { budget_exceeded: "insufficient_budget" };

/**
 * The spec's error table ("Errors", account-owned routes), keyed by the domain code that
 * api-edge or a service behind it raised. The one place a code becomes an HTTP status.
 */
const STATUS_BY_CODE: Record<string, number> = {
  // api-edge
  missing_api_key: 401,
  wrong_auth_scheme: 401,
  wrong_auth_field: 401,
  invalid_json: 400,
  json_too_deep: 400,
  invalid_request: 400,
  unsupported_media_type: 415,
  payload_too_large: 413,
  not_found: 404,
  method_not_allowed: 405,
  idempotency_key_invalid: 400,
  idempotency_unsupported_for_streams: 400,
  idempotency_key_reused: 422,
  idempotency_in_progress: 409,
  // auth-policy
  invalid_api_key: 401,
  expired_api_key: 401,
  revoked_api_key: 401,
  rotated_api_key: 401,
  model_not_allowed: 403,
  output_cap_above_policy: 403,
  route_not_allowed: 403,
  tokens_above_rate_limit: 403,
  rate_limited: 429,
  budget_exceeded: 402,
  invalid_argument: 400,
  account_not_found: 404,
  connection_not_found: 404,
  key_not_found: 404,
  account_exists: 409,
  connection_exists: 409,
  key_not_active: 409,
  broadcast_failed: 503,
  // the paid door (docs/contract.md, "Errors"); 402 wherever the client should pay or re-sign
  payment_required: 402,
  mpp_session_deposit_below_request_cost: 402,
  mpp_voucher_bucket_refresh_required: 402,
  mpp_malformed_credential: 402,
  mpp_invalid_challenge: 402,
  mpp_body_digest_mismatch: 402,
  mpp_payment_verification_failed: 402,
  mpp_method_unsupported: 400,
  mpp_invalid_request: 400,
  mpp_request_quote_invalid: 400,
  mpp_request_exceeds_voucher_bucket: 400,
  mpp_streaming_unavailable: 400,
  mpp_payer_not_allowed: 403,
  mpp_channel_finalized: 410,
  mpp_reservation_failed: 503,
  mpp_commit_failed: 500,
  mpp_session_close_unavailable: 503,
  mpp_session_close_failed: 502,
  // inference-router
  upstream_rejected: 400,
  model_cannot_reason: 400,
  model_not_found: 503,
  upstream_error: 502,
  upstream_timeout: 504,
  usage_not_recorded: 503,
};

/**
 * Paid-door codes whose caller action is a 5xx-like "stop and surface" (docs/contract.md,
 * "Errors"): their message is kept, since it names no internal cause.
 */
const SURFACED = new Set([
  "mpp_commit_failed",
  "mpp_reservation_failed",
  "mpp_session_close_unavailable",
  "mpp_session_close_failed",
]);

/** Messages for 5xx: the cause is logged, never sent. */
const SERVER_MESSAGES: Record<number, string> = {
  500: "The gateway failed to process the request. Retry with backoff and keep the request id.",
  502: "The upstream model failed. Retry with backoff and keep the request id.",
  503: "The gateway is temporarily unavailable. Retry with backoff and keep the request id.",
  504: "The upstream model did not answer in time. Retry with backoff and keep the request id.",
};

function serverError(status: number, code: string): HttpError {
  return { status, type: "server_error", code, message: SERVER_MESSAGES[status] ?? SERVER_MESSAGES[500]! };
}

/** Maps anything thrown while serving a request to the caller's error; logs what the caller does not see. */
export function toHttpError(err: unknown, log: FastifyBaseLogger): HttpError {
  if (err instanceof EdgeError || (err instanceof RemoteError && err.code && STATUS_BY_CODE[err.code])) {
    const code = (err as EdgeError | RemoteError).code!;
    const status = STATUS_BY_CODE[code]!;
    if (status >= 500) {
      log.warn({ code, err }, "request failed upstream");
      const e = SURFACED.has(code)
        ? { ...serverError(status, code), message: err.message }
        : serverError(status, code);
      // Every upstream of the model is cooled down: when the first comes back.
      const retryAfter = err instanceof RemoteError ? err.details[INFERENCE_DETAILS.retryAfter] : undefined;
      return retryAfter !== undefined && /^\d+$/.test(retryAfter)
        ? { ...e, headers: { "retry-after": retryAfter } }
        : e;
    }
    const headers =
      err instanceof RemoteError && code === "rate_limited"
        ? rateLimitHeaders(err.details)
        : err instanceof RemoteError && code === "budget_exceeded"
          ? budgetHeaders(err.details)
          : undefined;
    return {
      status,
      type: TYPE_BY_CODE[code] ?? TYPE_BY_STATUS[status] ?? "invalid_request_error",
      code,
      message: err.message,
      ...(headers ? { headers } : {}),
    };
  }
  if (err instanceof RemoteError && err.status === GrpcStatus.CANCELLED) {
    // The caller went away and the call behind it was cancelled: nobody reads this answer.
    log.info({ grpcStatus: err.status }, "caller went away");
    return {
      status: 499,
      type: "server_error",
      code: "client_closed_request",
      message: "the caller closed the request",
    };
  }
  if (
    err instanceof RemoteError &&
    (err.status === GrpcStatus.UNAUTHENTICATED || err.status === GrpcStatus.PERMISSION_DENIED)
  ) {
    // An internal service refused this process's credential: a deployment fault, never the
    // caller's, and nothing about it is sent (docs/runbooks/internal-auth.md).
    log.error(
      { grpcStatus: err.status, code: err.code },
      "internal service refused the gateway's credential",
    );
    return serverError(500, "internal_error");
  }
  if (err instanceof RemoteError) {
    log.error({ err, grpcStatus: err.status }, "service call failed");
    if (err.status === GrpcStatus.UNAVAILABLE) return serverError(503, "service_unavailable");
    if (err.status === GrpcStatus.DEADLINE_EXCEEDED) return serverError(504, "gateway_timeout");
    return serverError(500, "internal_error");
  }
  if (isRedisUnavailable(err)) {
    // api-edge's own Redis (idempotency records) is down or restarting: retryable.
    log.warn({ err }, "store unavailable");
    return serverError(503, "service_unavailable");
  }
  // Fastify's own errors (body too large, bad content type, ...), mapped by their status.
  const fastifyErr = err as { statusCode?: number; code?: string };
  if (fastifyErr.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    return {
      status: 413,
      type: TYPE_BY_STATUS[413]!,
      code: "payload_too_large",
      message: "the request body is too large",
    };
  }
  if (fastifyErr.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") {
    return {
      status: 415,
      type: TYPE_BY_STATUS[415]!,
      code: "unsupported_media_type",
      message: "send the body as Content-Type: application/json",
    };
  }
  if (
    typeof fastifyErr.statusCode === "number" &&
    fastifyErr.statusCode >= 400 &&
    fastifyErr.statusCode < 500
  ) {
    return {
      status: 400,
      type: TYPE_BY_STATUS[400]!,
      code: "invalid_request",
      message: "the request could not be read",
    };
  }
  log.error({ err }, "request failed");
  return serverError(500, "internal_error");
}

/**
 * Retry-After and the RateLimit header fields of a refusal, from the details auth-policy
 * attached (RATE_LIMIT_DETAILS).
 */
function rateLimitHeaders(details: Readonly<Record<string, string>>): Record<string, string> {
  const headers: Record<string, string> = {};
  const copy = (detail: string, header: string) => {
    const value = details[detail];
    if (value !== undefined && /^\d+$/.test(value)) headers[header] = value;
  };
  copy(RATE_LIMIT_DETAILS.retryAfter, "retry-after");
  copy(RATE_LIMIT_DETAILS.limit, "ratelimit-limit");
  copy(RATE_LIMIT_DETAILS.remaining, "ratelimit-remaining");
  copy(RATE_LIMIT_DETAILS.reset, "ratelimit-reset");
  return headers;
}

/**
 * What a budget refusal tells the caller: the budget left this period and when it renews. No
 * Retry-After: the period may end weeks from now.
 */
function budgetHeaders(details: Readonly<Record<string, string>>): Record<string, string> {
  const headers: Record<string, string> = {};
  const remaining = details[BUDGET_DETAILS.remaining];
  const reset = details[BUDGET_DETAILS.reset];
  if (remaining !== undefined && /^\d+$/.test(remaining)) headers["x-tollgate-budget-remaining"] = remaining;
  if (reset !== undefined && /^\d+$/.test(reset)) headers["x-tollgate-budget-reset"] = reset;
  return headers;
}

/** The OpenAI-style body of an error. */
export function errorBody(e: HttpError, requestId: string) {
  return { error: { message: e.message, type: e.type, code: e.code, request_id: requestId } };
}

/**
 * Problem type URIs the mppx client recognizes (its own problem catalogue), by our code; others get
 * our own URI.
 */
const PROBLEM_TYPES: Record<string, string> = {
  payment_required: "payment-required",
  mpp_malformed_credential: "malformed-credential",
  mpp_invalid_challenge: "invalid-challenge",
  mpp_payment_verification_failed: "verification-failed",
  mpp_method_unsupported: "method-unsupported",
  mpp_session_deposit_below_request_cost: "session/insufficient-balance",
  mpp_voucher_bucket_refresh_required: "payment-insufficient",
  mpp_channel_finalized: "session/channel-finalized",
};

/**
 * The paid door's error body: RFC 9457 problem details as an mppx client reads them, with the
 * contract's code (docs/contract.md, "Errors"), and the OpenAI-style `error` object for
 * OpenAI-minded callers.
 */
export function problemBody(e: HttpError, requestId: string, challengeId?: string) {
  const suffix = PROBLEM_TYPES[e.code];
  return {
    type: suffix ? `https://paymentauth.org/problems/${suffix}` : `https://tollgate.dev/problems/${e.code}`,
    title: e.code,
    status: e.status,
    detail: e.message,
    code: e.code,
    request_id: requestId,
    ...(challengeId ? { challengeId } : {}),
    error: { message: e.message, type: e.type, code: e.code, request_id: requestId },
  };
}
