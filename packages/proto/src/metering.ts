// Re-export of the generated tollgate.metering.v1 code (see proto/tollgate/metering/v1).
import "./text-encoding.js";

export * from "./gen/tollgate/metering/v1/metering_pb.js";
