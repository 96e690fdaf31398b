import type { AttemptFailure, InferenceError } from "../../domain/errors.js";
import { attemptFailure, statusFailure } from "../upstream-http/http-provider.js";

/**
 * The Messages API's error statuses (its body `{type:"error", error:{type, message}}`): 400
 * invalid_request_error, 404 not_found_error and 413 request_too_large are the caller's request
 * (not retried); 401 authentication_error and 403 permission_error the gateway's key; 429
 * rate_limit_error, 500 api_error and 529 overloaded_error the upstream's state (retried on
 * another upstream, Retry-After honoured on 429, 503 and 529).
 */
export function anthropicStatusError(
  status: number,
  text: string,
  retryAfter: string | string[] | undefined,
): InferenceError {
  return statusFailure(status, text, retryAfter, [429, 503, 529]);
}

/** Each error type of the Messages API as the attempt failure it means (mid-stream `error` events). */
const ERROR_TYPES: Readonly<Record<string, AttemptFailure>> = {
  invalid_request_error: "status_4xx",
  not_found_error: "status_4xx",
  request_too_large: "status_4xx",
  authentication_error: "status_auth",
  permission_error: "status_auth",
  rate_limit_error: "status_429",
  api_error: "status_5xx",
  overloaded_error: "status_5xx",
};

/**
 * A stream's `error` event (`{type, message}`): the upstream failed after answering 200, as its
 * error type says (an overloaded upstream mid-stream is a 529 that came late); an unknown type is
 * an interrupted answer. A caller error's message is passed on; the upstream's own are not.
 */
export function errorEventFailure(raw: unknown): InferenceError {
  const error = (raw ?? {}) as { type?: unknown; message?: unknown };
  const kind = (typeof error.type === "string" && ERROR_TYPES[error.type]) || "interrupted";
  if (kind === "status_4xx") {
    const message = typeof error.message === "string" ? error.message.slice(0, 500) : "";
    return attemptFailure("upstream_rejected", message || "the upstream refused the request", kind);
  }
  return attemptFailure("upstream_error", "the upstream failed mid-stream", kind);
}

/** An answer or stream event that is not the Messages API's. */
export function unreadable(): InferenceError {
  return attemptFailure("upstream_error", "the upstream sent an unreadable answer", "interrupted");
}
