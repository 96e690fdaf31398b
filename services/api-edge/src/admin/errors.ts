import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import type { FastifyBaseLogger } from "fastify";

/** Refusals the admin server decides itself, before auth-policy or metering is asked. */
export type AdminErrorCode =
  | "missing_admin_token"
  | "invalid_admin_token"
  | "invalid_request"
  | "invalid_json"
  | "json_too_deep"
  | "unsupported_media_type"
  | "payload_too_large"
  | "not_found";

/** The one error class of the admin server's own decisions. */
export class AdminError extends Error {
  constructor(
    readonly code: AdminErrorCode,
    message: string,
  ) {
    super(message);
    this.name = "AdminError";
  }
}

/** Codes auth-policy's admin RPCs and metering's GetUsage send (their READMEs' error tables). */
type RemoteAdminCode =
  | "invalid_argument"
  | "account_not_found"
  | "connection_not_found"
  | "key_not_found"
  | "account_exists"
  | "connection_exists"
  | "key_not_active"
  | "broadcast_failed"
  | "invalid_time_range"
  | "time_range_too_large"
  | "invalid_granularity";

/**
 * Every admin code's HTTP status, once and exhaustively. The admin port has its own table
 * (next to, not inside, the public door's http/errors.ts) because none of these codes can
 * occur on the public port and none of the public door's can occur here.
 */
const STATUS_BY_CODE = {
  missing_admin_token: 401,
  invalid_admin_token: 401,
  invalid_request: 400,
  invalid_json: 400,
  json_too_deep: 400,
  unsupported_media_type: 415,
  payload_too_large: 413,
  not_found: 404,
  invalid_argument: 400,
  account_not_found: 404,
  connection_not_found: 404,
  key_not_found: 404,
  account_exists: 409,
  connection_exists: 409,
  // Rotating a revoked, expired or already rotated key: the key's state conflicts.
  key_not_active: 409,
  // The state changed but caches may not know yet; the message tells the caller to retry.
  broadcast_failed: 503,
  invalid_time_range: 400,
  time_range_too_large: 400,
  invalid_granularity: 400,
} satisfies Record<AdminErrorCode | RemoteAdminCode, number>;

const TYPE_BY_STATUS: Record<number, string> = {
  400: "invalid_request_error",
  401: "authentication_error",
  404: "not_found_error",
  409: "conflict_error",
  413: "invalid_request_error",
  415: "invalid_request_error",
};

/** An admin error as the caller sees it. */
export interface AdminHttpError {
  status: number;
  type: string;
  code: string;
  message: string;
}

const isKnown = (code: string | undefined): code is keyof typeof STATUS_BY_CODE =>
  code !== undefined && Object.hasOwn(STATUS_BY_CODE, code);

/** Maps anything thrown while serving an admin request; logs what the caller does not see. */
export function toAdminHttpError(err: unknown, log: FastifyBaseLogger): AdminHttpError {
  if (err instanceof AdminError || (err instanceof RemoteError && isKnown(err.code))) {
    const code = err.code as keyof typeof STATUS_BY_CODE;
    const status = STATUS_BY_CODE[code];
    if (status >= 500) log.warn({ code, err }, "admin call failed");
    return {
      status,
      type: TYPE_BY_STATUS[status] ?? "server_error",
      code,
      message: err.message,
    };
  }
  if (err instanceof RemoteError) {
    log.error({ err, grpcStatus: err.status, code: err.code }, "admin service call failed");
    if (err.status === GrpcStatus.UNAVAILABLE) {
      return {
        status: 503,
        type: "server_error",
        code: "service_unavailable",
        message: "a service behind the admin API is unavailable; retry with backoff",
      };
    }
    if (err.status === GrpcStatus.DEADLINE_EXCEEDED) {
      return {
        status: 504,
        type: "server_error",
        code: "gateway_timeout",
        message: "a service behind the admin API did not answer in time; retry with backoff",
      };
    }
    return internal();
  }
  const fastifyErr = err as { statusCode?: number; code?: string };
  if (fastifyErr.code === "FST_ERR_CTP_BODY_TOO_LARGE") {
    return toAdminHttpError(new AdminError("payload_too_large", "the request body is too large"), log);
  }
  if (
    typeof fastifyErr.statusCode === "number" &&
    fastifyErr.statusCode >= 400 &&
    fastifyErr.statusCode < 500
  ) {
    return toAdminHttpError(new AdminError("invalid_request", "the request could not be read"), log);
  }
  log.error({ err }, "admin request failed");
  return internal();
}

function internal(): AdminHttpError {
  return {
    status: 500,
    type: "server_error",
    code: "internal_error",
    message: "the admin API failed to process the request",
  };
}

/** The OpenAI-style body of an admin error. */
export function adminErrorBody(e: AdminHttpError, requestId: string) {
  return { error: { message: e.message, type: e.type, code: e.code, request_id: requestId } };
}
