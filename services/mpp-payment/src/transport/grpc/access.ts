import type { AccessTable } from "@tollgate/kit/credentials";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { PaymentService } from "@tollgate/proto/payment";

/** Who may call each PaymentService method (docs/kubernetes.md, "Internal authentication"): the paid door. */
export const paymentAccess: AccessTable<MethodsOf<typeof PaymentService>> = {
  challenge: ["api-edge"],
  verify: ["api-edge"],
  reserve: ["api-edge"],
  commit: ["api-edge"],
  release: ["api-edge"],
  close: ["api-edge"],
};
