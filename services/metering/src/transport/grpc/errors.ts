import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { MeteringError, type MeteringErrorCode } from "../../domain/errors.js";

/** Each metering code's gRPC status, once and exhaustively. */
const STATUS = {
  invalid_time_range: GrpcStatus.INVALID_ARGUMENT,
  time_range_too_large: GrpcStatus.INVALID_ARGUMENT,
  invalid_granularity: GrpcStatus.INVALID_ARGUMENT,
  invalid_usage_event: GrpcStatus.INVALID_ARGUMENT,
} satisfies Record<MeteringErrorCode, GrpcStatus>;

/** Turns a domain error into the status the bridge sends; anything else passes through. */
export function toStatusError(err: unknown): unknown {
  return err instanceof MeteringError ? new StatusError(STATUS[err.code], err.code, err.message) : err;
}
