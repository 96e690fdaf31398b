// Re-export of the generated tollgate.usage.v1 code (see proto/tollgate/usage/v1).
export * from "./gen/tollgate/usage/v1/usage_pb.js";
