// Re-export of the generated tollgate.auth.v1 code (see proto/tollgate/auth/v1).
export * from "./gen/tollgate/auth/v1/auth_pb.js";
