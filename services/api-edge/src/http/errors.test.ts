import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import type { FastifyBaseLogger } from "fastify";
import { describe, expect, it, vi } from "vitest";
import { EdgeError } from "../domain/errors.js";
import { toHttpError } from "./errors.js";

function fakeLog() {
  return { warn: vi.fn(), error: vi.fn() } as unknown as FastifyBaseLogger & {
    warn: ReturnType<typeof vi.fn>;
    error: ReturnType<typeof vi.fn>;
  };
}

describe("toHttpError: the spec's error table, in one place", () => {
  it.each([
    ["invalid_api_key", GrpcStatus.UNAUTHENTICATED, 401, "authentication_error"],
    ["expired_api_key", GrpcStatus.UNAUTHENTICATED, 401, "authentication_error"],
    ["revoked_api_key", GrpcStatus.UNAUTHENTICATED, 401, "authentication_error"],
    ["model_not_allowed", GrpcStatus.PERMISSION_DENIED, 403, "permission_error"],
    ["output_cap_above_policy", GrpcStatus.PERMISSION_DENIED, 403, "permission_error"],
    ["upstream_rejected", GrpcStatus.INVALID_ARGUMENT, 400, "invalid_request_error"],
  ])("maps remote %s to %i", (code, grpcStatus, status, type) => {
    const e = toHttpError(new RemoteError(grpcStatus, code, "why"), fakeLog());
    expect(e).toEqual({ status, type, code, message: "why" });
  });

  it("maps its own refusals", () => {
    expect(toHttpError(new EdgeError("wrong_auth_scheme", "m"), fakeLog()).status).toBe(401);
    expect(toHttpError(new EdgeError("invalid_json", "m"), fakeLog()).status).toBe(400);
    expect(toHttpError(new EdgeError("unsupported_media_type", "m"), fakeLog()).status).toBe(415);
  });

  it("never sends a 5xx cause to the caller, and logs it", () => {
    const log = fakeLog();
    const e = toHttpError(
      new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "connect ECONNREFUSED 10.0.0.7"),
      log,
    );
    expect(e.status).toBe(502);
    expect(e.type).toBe("server_error");
    expect(e.message).not.toContain("10.0.0.7");
    expect(log.warn).toHaveBeenCalled();
  });

  it("tells when to retry a 502 whose model has every upstream cooled down", () => {
    const cooled = new RemoteError(
      GrpcStatus.UNAVAILABLE,
      "upstream_error",
      "every upstream is cooled down",
      {
        "retry-after": "12",
      },
    );
    expect(toHttpError(cooled, fakeLog())).toMatchObject({ status: 502, headers: { "retry-after": "12" } });
    const plain = toHttpError(new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "boom"), fakeLog());
    expect(plain.headers).toBeUndefined();
  });

  it.each([
    [GrpcStatus.UNAUTHENTICATED, "unauthenticated", "unauthenticated"],
    [GrpcStatus.PERMISSION_DENIED, "permission_denied", "api-edge may not call CreateKey"],
  ])(
    "maps an internal service refusing the gateway's own credential (%s) to a bare 500",
    (status, code, msg) => {
      const log = fakeLog();
      const e = toHttpError(new RemoteError(status, code, msg), log);
      expect(e).toMatchObject({ status: 500, type: "server_error", code: "internal_error" });
      expect(e.message).not.toContain(msg);
      expect(log.error).toHaveBeenCalledOnce();
    },
  );

  it("maps an unreachable service to 503 and anything unknown to 500", () => {
    const log = fakeLog();
    expect(
      toHttpError(new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "No connection established"), log),
    ).toMatchObject({
      status: 503,
      code: "service_unavailable",
    });
    // Retryable and expected while a replica stops: a warning, not an error line to page on.
    expect(log.warn).toHaveBeenCalledOnce();
    expect(log.error).not.toHaveBeenCalled();
    expect(
      toHttpError(new RemoteError(GrpcStatus.DEADLINE_EXCEEDED, undefined, "deadline"), fakeLog()).status,
    ).toBe(504);
    const unknown = fakeLog();
    expect(toHttpError(new Error("boom"), unknown)).toMatchObject({ status: 500, code: "internal_error" });
    expect(unknown.error).toHaveBeenCalled();
  });
});
