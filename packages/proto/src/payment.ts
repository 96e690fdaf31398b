// Re-export of the generated tollgate.payment.v1 code (see proto/tollgate/payment/v1).
export * from "./gen/tollgate/payment/v1/payment_pb.js";
