// Re-export of the generated tollgate.inference.v1 code (see proto/tollgate/inference/v1).

export * from "./gen/tollgate/inference/v1/cooldown_pb.js";
export * from "./gen/tollgate/inference/v1/inference_pb.js";
