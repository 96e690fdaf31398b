// Types that budget.ts, errors.ts and ports.ts all speak of. They live here, in a module that
// imports nothing, so that those modules never import each other in a circle (docs/boundaries.md).
// budget.ts and ports.ts re-export them: import them from there or from here.

/** How spend is counted: calendar month, ISO week (Monday) or calendar day in UTC, or N days. */
export type BudgetPeriod = "month" | "week" | "day" | { days: number };

/** A spend cap per period, in base units. */
export interface Budget {
  amount: bigint;
  period: BudgetPeriod;
}

/** Whose budget. */
export type BudgetScope = "connection" | "key";

/** One budget a request must fit, in the period it is made in. */
export interface BudgetCheck {
  /**
   * Stable identity of this budget's period: `{accountId}:connection:<c>:<period tag>` or
   * `{accountId}:key:<lineage id>:<period tag>`, the lineage id being the key's own id unless it
   * was rotated from another (keys.ts, lineageOf); the hash tag keeps one account in one Redis
   * slot.
   */
  id: string;
  scope: BudgetScope;
  /** The budget's amount. */
  limit: bigint;
  /** When the period ends (ms since the epoch): its spend is kept a settlement window longer. */
  periodEndMs: number;
}

/** What a budget looked like when a request was checked against it (live holds only). */
export interface BudgetCount {
  /** Settled spend of the period. */
  spent: bigint;
  /** Quotes of the live holds of the period, before this request's. */
  held: bigint;
}

/** Whose window: the whole account, one connection, one key, or one route of a connection. */
export type RateScope = "account" | "connection" | "key" | "route";
/** What a window counts. */
export type RateUnit = "requests" | "tokens";

/** How a settlement went. */
export type SettleOutcome =
  /** The hold was removed and the cost added to the period's spend. */
  | "settled"
  /** The hold had expired already; the cost was still added to the period's spend. */
  | "settled_after_expiry"
  /** Settled before: nothing changed. */
  | "already_settled"
  /** Not a reservation of ours, or older than the settlement window: nothing changed. */
  | "unknown";

/** The result of one settlement. */
export interface Settlement {
  outcome: SettleOutcome;
  /** The cost the reservation was settled with (the first settlement's); undefined if unknown. */
  cost?: bigint;
  /**
   * Set only by the settlement that charged it, when the cost asked was above what is left of
   * what was reserved for it (a reservation's hold, a lease's allowance): the part not charged.
   */
  uncharged?: bigint;
}

/** One reservation of a batch settlement (Ledger.settleMany). */
export interface SettleItem {
  reservationId: string;
  /** The actual cost, in base units. */
  cost: bigint;
  /** The usage event that settles it, kept for audit. */
  eventId: string;
}
