// Re-export of the generated tollgate.inference.v1 code (see proto/tollgate/inference/v1).

export * from "./gen/tollgate/inference/v1/cooldown_pb.js";
export * from "./gen/tollgate/inference/v1/inference_pb.js";

/**
 * Detail names of an inference failure (trailing metadata `tollgate-<name>`, arriving in
 * `RemoteError.details[<name>]`). api-edge turns `retry-after` into the Retry-After header.
 */
export const INFERENCE_DETAILS = {
  /** Whole seconds until an upstream of the model is out of its cooldown (at least 1). */
  retryAfter: "retry-after",
} as const;
