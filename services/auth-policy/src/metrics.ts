import { type Handlers, StatusError } from "@tollgate/kit/grpc";
import { Counter, countUnaryCalls, errorOutcome, METRIC_PREFIX, type Registry } from "@tollgate/kit/metrics";
import {
  type AuthorizeResponse,
  type AuthService,
  RATE_LIMIT_DETAILS,
  SettleOutcome,
} from "@tollgate/proto/auth";
import { operationOf } from "@tollgate/proto/routes";

/** What became of a budget reservation. */
export type ReservationOutcome = "reserved" | "refused" | "settled" | "expired";

/** The refusal of a quote that does not fit the budget (auth.proto, message Budget). */
const BUDGET_REFUSAL = "budget_exceeded";

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
   * Counts a reservation event. Authorize grants (reserved), budget refusals (refused) and
   * SettleReservation answers (settled) are counted from the RPCs by countAuthCalls; the
   * budget code calls this for what no RPC shows: a hold that expires unused ("expired").
   */
  reservation(outcome: ReservationOutcome): void;
}

/** Registers auth-policy's metrics on `registry`. */
export function authMetrics(registry: Registry): AuthMetrics {
  const registers = [registry];
  const reservations = new Counter({
    name: `${METRIC_PREFIX}reservations_total`,
    help: "Budget reservations by outcome: reserved, refused (budget_exceeded), settled, expired",
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
      help: "Authorize calls by route and outcome (ok or the refusal code); AcquireLease refusals too",
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

/** Counts Authorize outcomes, rate-limit refusals and reservation events from AuthService calls. */
export function countAuthCalls(
  handlers: Handlers<typeof AuthService>,
  m: AuthMetrics,
): Handlers<typeof AuthService> {
  // The thrown error is needed for the rate-limit scope, which countUnaryCalls does not pass on.
  const authorize = handlers.authorize;
  const acquireLease = handlers.acquireLease;
  const counted: Handlers<typeof AuthService> = {
    ...handlers,
    // A lease's refusal is the refusal Authorize would have given the same request.
    acquireLease: async (req, ctx) => {
      try {
        return await acquireLease(req, ctx);
      } catch (err) {
        const route = operationOf(req.request?.route ?? 0) ?? "unspecified";
        m.authorize.inc({ route, outcome: errorOutcome(err) });
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
        const outcome = errorOutcome(err);
        m.authorize.inc({ route, outcome });
        if (outcome === BUDGET_REFUSAL) m.reservation("refused");
        if (outcome === "rate_limited" && err instanceof StatusError) {
          m.rateLimited.inc({ scope: err.details[RATE_LIMIT_DETAILS.scope] ?? "unknown" });
        }
        throw err;
      }
    },
  };
  const countSettled = (settled: SettleOutcome | undefined) => {
    if (settled === SettleOutcome.SETTLED || settled === SettleOutcome.SETTLED_AFTER_EXPIRY) {
      m.reservation("settled");
    }
  };
  return countUnaryCalls(counted, (method, outcome, _req, res) => {
    m.calls.inc({ method, outcome });
    if (outcome !== "ok") return;
    if (method === "acquireLease")
      m.leases.inc({ outcome: (res as { granted?: boolean }).granted ? "granted" : "none" });
    if (method === "returnLease") m.leases.inc({ outcome: "returned" });
    if (method === "settleReservation")
      countSettled((res as { outcome?: SettleOutcome } | undefined)?.outcome);
    if (method === "settleReservations") {
      for (const r of (res as { results?: Array<{ outcome?: SettleOutcome }> } | undefined)?.results ?? [])
        countSettled(r.outcome);
    }
  });
}
