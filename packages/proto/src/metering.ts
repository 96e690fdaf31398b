// Re-export of the generated tollgate.metering.v1 code (see proto/tollgate/metering/v1).
export * from "./gen/tollgate/metering/v1/metering_pb.js";
