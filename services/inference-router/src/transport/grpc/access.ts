import type { AccessTable } from "@tollgate/kit/credentials";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { InferenceService } from "@tollgate/proto/inference";

/** Who may call each InferenceService method (README, "Internal authentication"). */
export const inferenceAccess: AccessTable<MethodsOf<typeof InferenceService>> = {
  complete: ["api-edge"],
  streamComplete: ["api-edge"],
};
