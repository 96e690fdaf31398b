import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { INFERENCE_DETAILS } from "@tollgate/proto/inference";
import { InferenceError, type InferenceErrorCode } from "../../domain/errors.js";

/** Each inference code's gRPC status, once and exhaustively. */
const STATUS = {
  invalid_request: GrpcStatus.INVALID_ARGUMENT,
  model_not_found: GrpcStatus.NOT_FOUND,
  model_cannot_reason: GrpcStatus.INVALID_ARGUMENT,
  upstream_rejected: GrpcStatus.INVALID_ARGUMENT,
  upstream_error: GrpcStatus.UNAVAILABLE,
  upstream_timeout: GrpcStatus.DEADLINE_EXCEEDED,
  usage_not_recorded: GrpcStatus.UNAVAILABLE,
} satisfies Record<InferenceErrorCode, GrpcStatus>;

/** Turns a domain error into the status the bridge sends; anything else passes through. */
export function toStatusError(err: unknown): unknown {
  if (!(err instanceof InferenceError)) return err;
  const details: Record<string, string> =
    err.retryAfterMs === undefined
      ? {}
      : { [INFERENCE_DETAILS.retryAfter]: String(Math.max(1, Math.ceil(err.retryAfterMs / 1_000))) };
  return new StatusError(STATUS[err.code], err.code, err.message, details);
}
