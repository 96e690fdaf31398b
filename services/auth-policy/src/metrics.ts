import { type Handlers, StatusError } from "@tollgate/kit/grpc";
import { Counter, countUnaryCalls, errorOutcome, METRIC_PREFIX, type Registry } from "@tollgate/kit/metrics";
import { isRedisUnavailable } from "@tollgate/kit/redis";
import {
  type AcquireLeaseResponse,
  type AuthorizeResponse,
  type AuthService,
  RATE_LIMIT_DETAILS,
} from "@tollgate/proto/auth";
import { operationOf } from "@tollgate/proto/routes";

/** What became of a budget reservation. */
export type ReservationOutcome = "reserved" | "refused" | "settled" | "expired";

/** The refusal of a quote that does not fit the budget (auth.proto, message Budget). */
const BUDGET_REFUSAL = "budget_exceeded";

/**
 * An Authorize's outcome label: `unavailable` when Redis could not be reached (the caller gets
 * gRPC UNAVAILABLE, HTTP 503 service_unavailable), else errorOutcome (`internal`: a bug, 500).
 */
const authorizeOutcome = (err: unknown) => (isRedisUnavailable(err) ? "unavailable" : errorOutcome(err));

/**
 * auth-policy's Prometheus instruments (docs/operations.md, "Metrics"). Labels are route names, error codes
 * and rate-limit scopes only: never keys, key ids, accounts or connections.
 */
export interface AuthMetrics {
  authorize: Counter<"route" | "outcome">;
  rateLimited: Counter<"scope">;
  reservations: Counter<"outcome">;
  /** Every AuthService call by method and outcome: how many calls the account door costs. */
  calls: Counter<"method" | "outcome">;
  /** Leases by outcome: granted, none (a budget or window too close to its end), returned. */
  leases: Counter<"outcome">;
  /**
   * Settlements that asked more than was reserved for them, charged only that (docs/money.md,
   * "Charges" and "Leases"), by kind (lease, reservation), and the base units not charged.
   */
  overHold: Counter<"kind">;
  overHoldBaseUnits: Counter<"kind">;
  /**
   * Counts a budget hold's event; a lease's hold counts as one hold, like a request's
   * (docs/runbooks/auth-policy.md, "Alerts"). Holds taken (reserved: an Authorize that holds, an
   * AcquireLease granted with a budget allowance) and budget refusals (refused) are counted from
   * the RPCs by countAuthCalls; the budget code calls this for how a hold ends: settled (a
   * reservation's settlement, or the charge or return that leaves nothing of a lease held; not
   * each charge on a lease) and expired (its TTL passed first).
   */
  reservation(outcome: ReservationOutcome): void;
}

/** Registers auth-policy's metrics on `registry`. */
export function authMetrics(registry: Registry): AuthMetrics {
  const registers = [registry];
  const reservations = new Counter({
    name: `${METRIC_PREFIX}reservations_total`,
    help: "Budget holds (a request's reservation, or a lease as one) by outcome: reserved, refused (budget_exceeded), settled, expired",
    labelNames: ["outcome"],
    registers,
  });
  for (const outcome of ["reserved", "refused", "settled", "expired"]) reservations.inc({ outcome }, 0);
  const leases = new Counter({
    name: `${METRIC_PREFIX}leases_total`,
    help: "Leases by outcome: granted, none (too close to the end of a budget or window), returned",
    labelNames: ["outcome"],
    registers,
  });
  for (const outcome of ["granted", "none", "returned"]) leases.inc({ outcome }, 0);
  const overHold = new Counter({
    name: `${METRIC_PREFIX}settlements_over_hold_total`,
    help: "Settlements whose cost was above what was reserved for them (a reservation's hold, what is left of a lease), charged only that, by kind",
    labelNames: ["kind"],
    registers,
  });
  const overHoldBaseUnits = new Counter({
    name: `${METRIC_PREFIX}settlements_over_hold_base_units_total`,
    help: "Base units named by settlements above what was reserved for them and not charged, by kind",
    labelNames: ["kind"],
    registers,
  });
  for (const kind of ["lease", "reservation"]) {
    overHold.inc({ kind }, 0);
    overHoldBaseUnits.inc({ kind }, 0);
  }
  return {
    overHold,
    overHoldBaseUnits,
    calls: new Counter({
      name: `${METRIC_PREFIX}auth_calls_total`,
      help: "AuthService calls by method and outcome (ok or the refusal code)",
      labelNames: ["method", "outcome"],
      registers,
    }),
    leases,
    authorize: new Counter({
      name: `${METRIC_PREFIX}authorize_total`,
      help: "Authorize calls by route and outcome (ok, the refusal code, unavailable: Redis unreachable, internal); AcquireLease refusals too",
      labelNames: ["route", "outcome"],
      registers,
    }),
    rateLimited: new Counter({
      name: `${METRIC_PREFIX}rate_limited_total`,
      help: "Requests refused by a rate limit, by the scope of the refusing window",
      labelNames: ["scope"],
      registers,
    }),
    reservations,
    reservation: (outcome) => reservations.inc({ outcome }),
  };
}

/** Counts Authorize outcomes, rate-limit refusals, leases, and holds taken or refused, from AuthService calls. */
export function countAuthCalls(
  handlers: Handlers<typeof AuthService>,
  m: AuthMetrics,
): Handlers<typeof AuthService> {
  // The thrown error is needed for the rate-limit scope, which countUnaryCalls does not pass on.
  const authorize = handlers.authorize;
  const acquireLease = handlers.acquireLease;
  /** A refused admission: its outcome, a budget refusal as a hold refused, a rate limit's scope. */
  const refused = (route: string, err: unknown) => {
    const outcome = authorizeOutcome(err);
    m.authorize.inc({ route, outcome });
    if (outcome === BUDGET_REFUSAL) m.reservation("refused");
    if (outcome === "rate_limited" && err instanceof StatusError) {
      m.rateLimited.inc({ scope: err.details[RATE_LIMIT_DETAILS.scope] ?? "unknown" });
    }
  };
  const counted: Handlers<typeof AuthService> = {
    ...handlers,
    // A lease's refusal is the refusal Authorize would have given the same request, counted alike.
    acquireLease: async (req, ctx) => {
      try {
        return await acquireLease(req, ctx);
      } catch (err) {
        refused(operationOf(req.request?.route ?? 0) ?? "unspecified", err);
        throw err;
      }
    },
    authorize: async (req, ctx) => {
      const route = operationOf(req.route) ?? "unspecified";
      try {
        const res = await authorize(req, ctx);
        m.authorize.inc({ route, outcome: "ok" });
        if ((res as Partial<AuthorizeResponse>).reservationId) m.reservation("reserved");
        return res;
      } catch (err) {
        refused(route, err);
        throw err;
      }
    },
  };
  // Settled and expired holds are counted by the budget code (AuthMetrics.reservation): only it
  // knows which charge on a lease ends the lease's hold.
  return countUnaryCalls(counted, (method, outcome, _req, res) => {
    m.calls.inc({ method, outcome });
    if (outcome !== "ok") return;
    if (method === "acquireLease") {
      const lease = res as Partial<AcquireLeaseResponse>;
      m.leases.inc({ outcome: lease.granted ? "granted" : "none" });
      // A lease with a budget allowance is one hold, as a request's reservation is.
      if (lease.granted && lease.budget) m.reservation("reserved");
    }
    if (method === "returnLease") m.leases.inc({ outcome: "returned" });
  });
}
