import type { ErrorCodeOf } from "@tollgate/proto/errors";

/** Refusals api-edge decides itself, before any other service is asked (packages/proto/src/errors.ts). */
export type EdgeErrorCode = ErrorCodeOf<"api-edge">;

/** The one error class of api-edge's own decisions. */
export class EdgeError extends Error {
  constructor(
    readonly code: EdgeErrorCode,
    message: string,
  ) {
    super(message);
    this.name = "EdgeError";
  }
}
