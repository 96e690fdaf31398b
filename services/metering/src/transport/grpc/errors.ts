import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { ERRORS } from "@tollgate/proto/errors";
import { MeteringError, type MeteringErrorCode } from "../../domain/errors.js";

/** Each metering code's gRPC status, from the one error table (packages/proto/src/errors.ts). */
const statusOf = (code: MeteringErrorCode): GrpcStatus => GrpcStatus[ERRORS[code].grpc];

/** Turns a domain error into the status the bridge sends; anything else passes through. */
export function toStatusError(err: unknown): unknown {
  return err instanceof MeteringError ? new StatusError(statusOf(err.code), err.code, err.message) : err;
}
