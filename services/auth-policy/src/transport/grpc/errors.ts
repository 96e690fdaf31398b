import { GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import { AuthError, type AuthErrorCode } from "../../domain/errors.js";

/** Each auth code's gRPC status, once and exhaustively. */
const STATUS = {
  missing_api_key: GrpcStatus.UNAUTHENTICATED,
  invalid_api_key: GrpcStatus.UNAUTHENTICATED,
  expired_api_key: GrpcStatus.UNAUTHENTICATED,
  revoked_api_key: GrpcStatus.UNAUTHENTICATED,
  model_not_allowed: GrpcStatus.PERMISSION_DENIED,
  output_cap_above_policy: GrpcStatus.PERMISSION_DENIED,
} satisfies Record<AuthErrorCode, GrpcStatus>;

/** Turns a domain error into the status the bridge sends; anything else passes through. */
export function toStatusError(err: unknown): unknown {
  return err instanceof AuthError ? new StatusError(STATUS[err.code], err.code, err.message) : err;
}
