/** Refusals api-edge decides itself, before any other service is asked. */
export type EdgeErrorCode =
  | "missing_api_key"
  | "wrong_auth_scheme"
  | "wrong_auth_field"
  | "invalid_json"
  | "json_too_deep"
  | "invalid_request"
  | "unsupported_media_type"
  | "payload_too_large"
  | "not_found"
  | "method_not_allowed"
  | "mpp_streaming_unavailable"
  | "mpp_commit_failed"
  | "idempotency_key_invalid"
  | "idempotency_key_reused"
  | "idempotency_in_progress"
  | "idempotency_unsupported_for_streams";

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
