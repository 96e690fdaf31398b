/** Every way a completion can fail in the router. */
export type InferenceErrorCode =
  | "invalid_request"
  | "model_not_found"
  | "model_cannot_reason"
  | "upstream_rejected"
  | "upstream_error"
  | "upstream_timeout"
  | "usage_not_recorded";

/** The one error class of the inference domain. */
export class InferenceError extends Error {
  constructor(
    readonly code: InferenceErrorCode,
    message: string,
  ) {
    super(message);
    this.name = "InferenceError";
  }
}
