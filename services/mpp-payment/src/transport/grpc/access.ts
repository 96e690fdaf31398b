import type { AccessTable } from "@tollgate/kit/credentials";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { PaymentService } from "@tollgate/proto/payment";

/**
 * Who may call each PaymentService method (docs/kubernetes.md, "Internal authentication"): the
 * paid door, and metering, which commits a paid hold from its usage event as well (docs/money.md,
 * "Paid door: the commit after the answer").
 */
export const paymentAccess: AccessTable<MethodsOf<typeof PaymentService>> = {
  challenge: ["api-edge"],
  verify: ["api-edge"],
  reserve: ["api-edge"],
  commit: ["api-edge", "metering"],
  release: ["api-edge"],
  close: ["api-edge"],
};
