import type { AccessTable } from "@tollgate/kit/credentials";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { MeteringService } from "@tollgate/proto/metering";

/**
 * Who may call each MeteringService method (docs/kubernetes.md, "Internal authentication"): api-edge's
 * admin API reads usage, and api-edge records a stream's usage when its router was lost.
 */
export const meteringAccess: AccessTable<MethodsOf<typeof MeteringService>> = {
  getUsage: ["api-edge"],
  recordUsage: ["api-edge"],
};
