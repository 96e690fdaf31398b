import type { AccessTable } from "@tollgate/kit/credentials";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { InferenceService } from "@tollgate/proto/inference";

/** Who may call each InferenceService method (docs/kubernetes.md, "Internal authentication"). */
export const inferenceAccess: AccessTable<MethodsOf<typeof InferenceService>> = {
  complete: ["api-edge"],
  streamComplete: ["api-edge"],
};
