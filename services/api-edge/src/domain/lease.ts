// One lease as api-edge spends it (docs/money.md, "Leases"): auth-policy granted a budget
// allowance and rate-limit units for requests of one key, route, model and cap; the edge admits
// such requests itself while the lease is usable, each holding its quote locally until its cost
// is known. Pure: no clock, no I/O.

/** What auth-policy granted. */
export interface LeaseTerms {
  /** Base units; undefined when no budget applies. */
  budget?: bigint;
  /** Requests units; undefined when no requests window applies. */
  requests?: number;
  /** Tokens units; undefined when no tokens window applies. */
  tokens?: number;
  /** Until when requests may be admitted on it (ms since the epoch). */
  usableUntilMs: number;
}

/** What one request needs of a lease. */
export interface LeaseNeed {
  /** Its quote; undefined when it has none. */
  quote?: bigint;
  /** The units a tokens window counts for it (input estimate plus output cap). */
  tokens: number;
}

/** How a request admitted on a lease ended. */
export type TicketEnd =
  /** Its cost is known: the rest of its quote goes back to the lease. */
  | { cost: bigint }
  /** It certainly cost nothing (failed before any usage, or never ran): its whole quote goes back. */
  | "released"
  /** Unknown (the caller went away, or the failure may hide usage): its quote stays committed. */
  | "unsure";

/** One request admitted on a lease; ends once (later ends are ignored). */
export interface Ticket {
  /** Its number within the lease, from 1: its reservation is `<lease id>~<ticket>`. */
  readonly ticket: number;
  readonly quote: bigint;
  end(how: TicketEnd): void;
  readonly ended: boolean;
}

/**
 * A lease's local account: what is left of each allowance, the requests in flight, and what is
 * committed (the exact costs of ended requests, and the quotes of those running or unsure).
 */
export class EdgeLease {
  private budgetLeft: bigint | undefined;
  private requestsLeft: number | undefined;
  private tokensLeft: number | undefined;
  private running = 0;
  private admittedCount = 0;
  private readonly unsure: Array<{ ticket: number; quote: bigint }> = [];
  /** Called when the last request in flight ends. */
  onIdle: (() => void) | undefined;

  constructor(readonly terms: LeaseTerms) {
    this.budgetLeft = terms.budget;
    this.requestsLeft = terms.requests;
    this.tokensLeft = terms.tokens;
  }

  /** Whether new requests may still be admitted on it at `nowMs`. */
  usable(nowMs: number): boolean {
    return nowMs < this.terms.usableUntilMs;
  }

  /** Admits one request if the lease covers it, holding its quote and taking its units. */
  admit(need: LeaseNeed, nowMs: number): Ticket | undefined {
    if (!this.usable(nowMs)) return undefined;
    const quote = need.quote ?? 0n;
    if (this.budgetLeft !== undefined && quote > this.budgetLeft) return undefined;
    if (this.requestsLeft !== undefined && this.requestsLeft < 1) return undefined;
    if (this.tokensLeft !== undefined && need.tokens > this.tokensLeft) return undefined;
    if (this.budgetLeft !== undefined) this.budgetLeft -= quote;
    if (this.requestsLeft !== undefined) this.requestsLeft -= 1;
    if (this.tokensLeft !== undefined) this.tokensLeft -= need.tokens;
    this.running++;
    this.admittedCount++;
    let ended = false;
    const number = this.admittedCount;
    const ticket: Ticket = {
      ticket: number,
      quote,
      get ended() {
        return ended;
      },
      end: (how) => {
        if (ended) return;
        ended = true;
        if (this.budgetLeft !== undefined) {
          if (how === "released") this.budgetLeft += quote;
          // A cost above the quote cannot happen (the quote bounds it); never credit a negative.
          else if (how !== "unsure" && how.cost < quote) this.budgetLeft += quote - how.cost;
        }
        if (how === "unsure") this.unsure.push({ ticket: number, quote });
        this.running--;
        if (this.running === 0) this.onIdle?.();
      },
    };
    return ticket;
  }

  /** Requests in flight. */
  get inFlight(): number {
    return this.running;
  }

  /** Requests admitted on it so far. */
  get admitted(): number {
    return this.admittedCount;
  }

  /** What is left of the budget allowance; undefined when no budget applies. */
  get budgetLeftNow(): bigint | undefined {
    return this.budgetLeft;
  }

  /** Units left of one kind; undefined when no window of that kind applies. */
  unitsLeft(unit: "requests" | "tokens"): number | undefined {
    return unit === "requests" ? this.requestsLeft : this.tokensLeft;
  }

  /**
   * What the lease is returned with: the base units committed on it (exact costs, and the
   * quotes of the requests still running or unsure), the unused units, and the unsure tickets.
   */
  returned(): {
    committed: bigint;
    unusedRequests: number;
    unusedTokens: number;
    unsure: ReadonlyArray<{ ticket: number; quote: bigint }>;
  } {
    const budget = this.terms.budget;
    return {
      committed: budget === undefined ? 0n : budget - (this.budgetLeft ?? 0n),
      unusedRequests: this.requestsLeft ?? 0,
      unusedTokens: this.tokensLeft ?? 0,
      unsure: budget === undefined ? [] : [...this.unsure],
    };
  }
}

/**
 * How many requests the next lease of a shape should cover: twice what the last lease admitted
 * (the demand of its period), at least 4, at most 1000.
 */
export function nextLeaseSize(lastAdmitted: number | undefined): number {
  return Math.min(1_000, Math.max(4, 2 * (lastAdmitted ?? 0)));
}
