/** Every way metering can refuse a query or an event. */
export type MeteringErrorCode =
  | "invalid_time_range"
  | "time_range_too_large"
  | "invalid_granularity"
  | "invalid_usage_event";

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
