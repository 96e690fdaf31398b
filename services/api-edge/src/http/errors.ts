import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { isRedisUnavailable } from "@tollgate/kit/redis";
import { BUDGET_DETAILS, RATE_LIMIT_DETAILS } from "@tollgate/proto/auth";
import {
  ERRORS,
  type ErrorSpec,
  type HttpErrorCode,
  isErrorCode,
  type OpenAiErrorType,
} from "@tollgate/proto/errors";
import { INFERENCE_DETAILS } from "@tollgate/proto/inference";
import { ROUTES } from "@tollgate/proto/routes";
import type { FastifyBaseLogger } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { anthropicErrorType } from "../domain/messages.js";

/** An OpenAI-style error as the caller sees it. */
export interface HttpError {
  status: number;
  type: OpenAiErrorType;
  code: HttpErrorCode;
  message: string;
  /** Extra response headers (Retry-After and RateLimit-* on a 429). */
  headers?: Record<string, string>;
}

/**
 * The one place a code becomes an HTTP status and type: the error table
 * (packages/proto/src/errors.ts), for the public doors, the paid door and the admin API alike.
 */
export function httpErrorOf(code: HttpErrorCode, message: string): HttpError {
  const { http, type } = ERRORS[code];
  return { status: http, type, code, message };
}

/**
 * Whether a code a service sent is one of the table's service codes. A code this build does not
 * know (a newer service) is not: it is answered by its gRPC status, and logged.
 */
function isServiceCode(code: string | undefined): code is HttpErrorCode {
  if (!isErrorCode(code)) return false;
  const spec: ErrorSpec = ERRORS[code];
  return spec.http !== null && spec.owners.some((owner) => owner !== "api-edge");
}

/**
 * Paid-door codes whose caller action is a 5xx-like "stop and surface" (docs/contract.md,
 * "Errors"): their message is kept, since it names no internal cause.
 */
const SURFACED: ReadonlySet<HttpErrorCode> = new Set<HttpErrorCode>([
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

function serverError(code: HttpErrorCode): HttpError {
  const e = httpErrorOf(code, "");
  return { ...e, message: SERVER_MESSAGES[e.status] ?? SERVER_MESSAGES[500]! };
}

/** Maps anything thrown while serving a request to the caller's error; logs what the caller does not see. */
export function toHttpError(err: unknown, log: FastifyBaseLogger): HttpError {
  const known =
    err instanceof EdgeError
      ? err.code
      : err instanceof RemoteError && isServiceCode(err.code)
        ? err.code
        : undefined;
  if (known !== undefined) {
    const e = httpErrorOf(known, (err as EdgeError | RemoteError).message);
    if (e.status >= 500) {
      log.warn({ code: known, err }, "request failed upstream");
      const answer = SURFACED.has(known) ? e : serverError(known);
      // Every upstream of the model is cooled down: when the first comes back.
      const retryAfter = err instanceof RemoteError ? err.details[INFERENCE_DETAILS.retryAfter] : undefined;
      return retryAfter !== undefined && /^\d+$/.test(retryAfter)
        ? { ...answer, headers: { "retry-after": retryAfter } }
        : answer;
    }
    const headers =
      err instanceof RemoteError && known === "rate_limited"
        ? rateLimitHeaders(err.details)
        : err instanceof RemoteError && known === "budget_exceeded"
          ? budgetHeaders(err.details)
          : undefined;
    return headers ? { ...e, headers } : e;
  }
  if (err instanceof RemoteError && err.status === GrpcStatus.CANCELLED) {
    // The caller went away and the call behind it was cancelled: nobody reads this answer.
    log.info({ grpcStatus: err.status }, "caller went away");
    return httpErrorOf("client_closed_request", "the caller closed the request");
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
    return serverError("internal_error");
  }
  if (err instanceof RemoteError) {
    // No code, or one the error table lacks (a newer service): answered by the gRPC status.
    // UNAVAILABLE (a replica stopping or unreachable) is retryable and expected during a rollout,
    // so it is a warning; anything else is an error (docs/runbooks/api-edge.md).
    const level = err.status === GrpcStatus.UNAVAILABLE ? "warn" : "error";
    log[level]({ err, grpcStatus: err.status, code: err.code }, "service call failed");
    if (err.status === GrpcStatus.UNAVAILABLE) return serverError("service_unavailable");
    if (err.status === GrpcStatus.DEADLINE_EXCEEDED) return serverError("gateway_timeout");
    return serverError("internal_error");
  }
  if (isRedisUnavailable(err)) {
    // api-edge's own Redis (idempotency records) is down or restarting: retryable.
    log.warn({ err }, "store unavailable");
    return serverError("service_unavailable");
  }
  // Fastify's own errors (body too large, bad content type, ...), mapped by their status.
  const fastifyErr = err as { statusCode?: number; code?: string };
  if (fastifyErr.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    return httpErrorOf("payload_too_large", "the request body is too large");
  }
  if (fastifyErr.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") {
    return httpErrorOf("unsupported_media_type", "send the body as Content-Type: application/json");
  }
  if (
    typeof fastifyErr.statusCode === "number" &&
    fastifyErr.statusCode >= 400 &&
    fastifyErr.statusCode < 500
  ) {
    return httpErrorOf("invalid_request", "the request could not be read");
  }
  log.error({ err }, "request failed");
  return serverError("internal_error");
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
 * The Anthropic-style body of an error (POST /v1/messages): Anthropic's error `type` for the
 * status the error table gives, the message, and the gateway's own code beside them.
 */
export function anthropicErrorBody(e: HttpError, requestId: string) {
  return {
    type: "error",
    error: { type: anthropicErrorType(e.status), message: e.message, code: e.code },
    request_id: requestId,
  };
}

/**
 * Problem type URIs the mppx client recognizes (its own problem catalogue), by our code; others get
 * our own URI.
 */
const PROBLEM_TYPES: Partial<Record<HttpErrorCode, string>> = {
  payment_required: "payment-required",
  mpp_malformed_credential: "malformed-credential",
  mpp_invalid_challenge: "invalid-challenge",
  mpp_payment_verification_failed: "verification-failed",
  mpp_method_unsupported: "method-unsupported",
  mpp_session_deposit_below_request_cost: "session/insufficient-balance",
  mpp_voucher_bucket_refresh_required: "payment-insufficient",
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

/**
 * An error in the shape of the route `path` names, for an answer given before any route ran (a
 * request Node's HTTP parser refused): Anthropic's on `/v1/messages` and below it, with its
 * `request-id` header; problem details on the paid route; OpenAI's elsewhere.
 */
export function errorAnswerFor(
  path: string | undefined,
  e: HttpError,
  requestId: string,
): { contentType: string; headers: Record<string, string>; body: unknown } {
  if (path === ROUTES.messages.path || path?.startsWith(`${ROUTES.messages.path}/`)) {
    return {
      contentType: "application/json; charset=utf-8",
      headers: { "request-id": requestId },
      body: anthropicErrorBody(e, requestId),
    };
  }
  if (path === ROUTES.mppChat.path) {
    return { contentType: "application/problem+json", headers: {}, body: problemBody(e, requestId) };
  }
  return { contentType: "application/json; charset=utf-8", headers: {}, body: errorBody(e, requestId) };
}
