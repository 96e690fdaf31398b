import type { Client, MethodsOf } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";
import type { AuthService } from "@tollgate/proto/auth";
import type { InferenceService } from "@tollgate/proto/inference";
import type { MeteringService } from "@tollgate/proto/metering";
import type { PaymentService } from "@tollgate/proto/payment";
import type { ResponseItemStore } from "../domain/response-items.js";
import type { Idempotency } from "../http/idempotency.js";
import type { RequestSchemas } from "../schemas/requests.js";
import type { LeaseBook } from "./leases.js";
import type { PaidCommits } from "./paid-commit.js";

/** The calls of each service the routes make: a gRPC client fits, and so does an in-memory fake. */
export type AuthClient = Pick<Client<MethodsOf<typeof AuthService>>, "authorize" | "settleReservation">;
export type InferenceClient = Pick<Client<MethodsOf<typeof InferenceService>>, "complete" | "streamComplete">;
export type MeteringClient = Pick<Client<MethodsOf<typeof MeteringService>>, "recordUsage">;
export type PaymentClient = Pick<
  Client<MethodsOf<typeof PaymentService>>,
  "challenge" | "verify" | "reserve" | "commit" | "release" | "close"
>;

/** What the account routes need: the clients of the services behind the edge. */
export interface AccountRouteContext {
  auth: AuthClient;
  inference: InferenceClient;
  /** Where a stream's usage is recorded when its router is lost mid-stream; absent: left to the hold's TTL. */
  metering?: MeteringClient;
  /** This replica's leases (docs/money.md, "Leases"); absent: every request is authorized on its own. */
  leases?: LeaseBook;
  /** Idempotency-Key handling for POST routes. */
  idempotency: Idempotency;
  /** The Responses output items kept for later `item_reference` inputs. */
  responseItems: ResponseItemStore;
  /** Request schemas built for the configured limits. */
  schemas: RequestSchemas;
  log: Logger;
}

/** What the paid route needs besides. */
export interface RouteContext extends AccountRouteContext {
  payment: PaymentClient;
  /** The Commits sent after their answers, which api-edge's stop waits for. */
  paidCommits: PaidCommits;
}

/** Deadline for recording a lost stream's usage with metering. */
export const RECORD_USAGE_TIMEOUT_MS = 5_000;

/** Deadline for an authorization call. */
export const AUTH_TIMEOUT_MS = 5_000;
