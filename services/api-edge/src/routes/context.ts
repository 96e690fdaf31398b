import type { Client, MethodsOf } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";
import type { AuthService } from "@tollgate/proto/auth";
import type { InferenceService } from "@tollgate/proto/inference";
import type { PaymentService } from "@tollgate/proto/payment";

/** What every route needs: the clients of the services behind the edge. */
export interface RouteContext {
  auth: Client<MethodsOf<typeof AuthService>>;
  inference: Client<MethodsOf<typeof InferenceService>>;
  payment: Client<MethodsOf<typeof PaymentService>>;
  log: Logger;
}

/** Deadline for an authorization call. */
export const AUTH_TIMEOUT_MS = 5_000;
