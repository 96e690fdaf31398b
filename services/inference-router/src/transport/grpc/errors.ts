import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { ERRORS } from "@tollgate/proto/errors";
import { INFERENCE_DETAILS } from "@tollgate/proto/inference";
import { InferenceError, type InferenceErrorCode } from "../../domain/errors.js";

/** Each inference code's gRPC status, from the one error table (packages/proto/src/errors.ts). */
const statusOf = (code: InferenceErrorCode): GrpcStatus => GrpcStatus[ERRORS[code].grpc];

/** Turns a domain error into the status the bridge sends; anything else passes through. */
export function toStatusError(err: unknown): unknown {
  if (!(err instanceof InferenceError)) return err;
  const details: Record<string, string> =
    err.retryAfterMs === undefined
      ? {}
      : { [INFERENCE_DETAILS.retryAfter]: String(Math.max(1, Math.ceil(err.retryAfterMs / 1_000))) };
  return new StatusError(statusOf(err.code), err.code, err.message, details);
}
