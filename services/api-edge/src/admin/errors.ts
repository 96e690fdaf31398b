import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import {
  ERRORS,
  type ErrorCodeOf,
  type ErrorCodeOn,
  type ErrorDoor,
  isErrorCode,
} from "@tollgate/proto/errors";
import type { FastifyBaseLogger } from "fastify";
import { type HttpError, httpErrorOf } from "../http/errors.js";

/** Refusals the admin server decides itself, before auth-policy or metering is asked. */
export type AdminErrorCode = AdminCode & ErrorCodeOf<"api-edge">;

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

/**
 * Every code the admin API answers: the error table's codes on the `admin` door
 * (packages/proto/src/errors.ts), its own and those auth-policy's admin RPCs and metering's
 * GetUsage send. None of the public door's other codes can occur on the admin port.
 */
type AdminCode = ErrorCodeOn<"admin">;

/** An admin error as the caller sees it: status and type from the same table as the public door's. */
export type AdminHttpError = Omit<HttpError, "headers">;

const isAdminCode = (code: string | undefined): code is AdminCode =>
  isErrorCode(code) && (ERRORS[code].doors as readonly ErrorDoor[]).includes("admin");

/** Maps anything thrown while serving an admin request; logs what the caller does not see. */
export function toAdminHttpError(err: unknown, log: FastifyBaseLogger): AdminHttpError {
  if (err instanceof AdminError || (err instanceof RemoteError && isAdminCode(err.code))) {
    // Admin answers keep their message even on a 5xx: it names no internal cause.
    const e = httpErrorOf(err.code as AdminCode, err.message);
    if (e.status >= 500) log.warn({ code: e.code, err }, "admin call failed");
    return e;
  }
  if (err instanceof RemoteError) {
    log.error({ err, grpcStatus: err.status, code: err.code }, "admin service call failed");
    if (err.status === GrpcStatus.UNAVAILABLE) {
      return httpErrorOf(
        "service_unavailable",
        "a service behind the admin API is unavailable; retry with backoff",
      );
    }
    if (err.status === GrpcStatus.DEADLINE_EXCEEDED) {
      return httpErrorOf(
        "gateway_timeout",
        "a service behind the admin API did not answer in time; retry with backoff",
      );
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
  return httpErrorOf("internal_error", "the admin API failed to process the request");
}

/** The OpenAI-style body of an admin error. */
export function adminErrorBody(e: AdminHttpError, requestId: string) {
  return { error: { message: e.message, type: e.type, code: e.code, request_id: requestId } };
}
