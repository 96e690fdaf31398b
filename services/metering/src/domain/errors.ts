import type { ErrorCodeOf } from "@tollgate/proto/errors";

/** Every way metering can refuse a query or an event (packages/proto/src/errors.ts). */
export type MeteringErrorCode = ErrorCodeOf<"metering">;

/** The one error class of the metering domain. */
export class MeteringError extends Error {
  constructor(
    readonly code: MeteringErrorCode,
    message: string,
  ) {
    super(message);
    this.name = "MeteringError";
  }
}
