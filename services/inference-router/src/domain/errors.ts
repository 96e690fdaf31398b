import type { ErrorCodeOf } from "@tollgate/proto/errors";

/** Every way a completion can fail in the router (packages/proto/src/errors.ts). */
export type InferenceErrorCode = ErrorCodeOf<"inference-router">;

/**
 * How one upstream attempt failed, for the failover policy and the attempt metrics:
 * - `connect_error`: no connection could be opened (refused, reset while connecting, unreachable,
 *   unknown host, connect timeout): the request never went out;
 * - `timeout`: no first byte (buffered) or first chunk (stream) within `firstTokenMs`;
 * - `idle_timeout`, `total_timeout`: an answer under way stalled, or the attempt ran too long;
 * - `status_429`, `status_5xx`: the upstream answered that status;
 * - `status_auth`: it refused the gateway's own credentials (401, 403): its fault, not the caller's;
 * - `status_4xx`: it refused the request itself (context too long, bad parameter);
 * - `interrupted`: the connection broke after the request went out, before or during the answer
 *   (closed, reset), or the answer was unreadable, an error event or an unfinished stream.
 */
export type AttemptFailure =
  | "connect_error"
  | "timeout"
  | "idle_timeout"
  | "total_timeout"
  | "status_429"
  | "status_5xx"
  | "status_auth"
  | "status_4xx"
  | "interrupted";

/** What an upstream adapter knows about a failed attempt. */
export interface UpstreamFailure {
  kind: AttemptFailure;
  /** The upstream's Retry-After on a 429 or 503, in milliseconds. */
  retryAfterMs?: number;
}

/** The one error class of the inference domain. */
export class InferenceError extends Error {
  constructor(
    readonly code: InferenceErrorCode,
    message: string,
    /** Set by upstream adapters: how the attempt failed. */
    readonly upstream?: UpstreamFailure,
    /** Set when every upstream of the model is cooled down: ms until the first comes back. */
    readonly retryAfterMs?: number,
  ) {
    super(message);
    this.name = "InferenceError";
  }
}
