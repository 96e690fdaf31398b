import type { Client, MethodsOf } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";
import type { AuthService } from "@tollgate/proto/auth";
import type { InferenceService } from "@tollgate/proto/inference";
import type { MeteringService } from "@tollgate/proto/metering";
import type { PaymentService } from "@tollgate/proto/payment";
import type { Idempotency } from "../http/idempotency.js";
import type { RequestSchemas } from "../schemas/requests.js";

/** What the account routes need: the clients of the services behind the edge. */
export interface AccountRouteContext {
  auth: Client<MethodsOf<typeof AuthService>>;
  inference: Client<MethodsOf<typeof InferenceService>>;
  /** Where a stream's usage is recorded when its router is lost mid-stream; absent: left to the hold's TTL. */
  metering?: Client<MethodsOf<typeof MeteringService>>;
  /** Idempotency-Key handling for POST routes. */
  idempotency: Idempotency;
  /** Request schemas built for the configured limits. */
  schemas: RequestSchemas;
  log: Logger;
}

/** What the paid route needs besides. */
export interface RouteContext extends AccountRouteContext {
  payment: Client<MethodsOf<typeof PaymentService>>;
}

/** Deadline for recording a lost stream's usage with metering. */
export const RECORD_USAGE_TIMEOUT_MS = 5_000;

/** Deadline for an authorization call. */
export const AUTH_TIMEOUT_MS = 5_000;
