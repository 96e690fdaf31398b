import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
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
  return err instanceof InferenceError ? new StatusError(STATUS[err.code], err.code, err.message) : err;
}
