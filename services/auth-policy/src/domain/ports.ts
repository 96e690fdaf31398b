import type { OperationName } from "@tollgate/proto/routes";
import type {
  Budget,
  BudgetCheck,
  BudgetCount,
  RateScope,
  RateUnit,
  SettleItem,
  Settlement,
} from "./types.js";

export type { RateScope, RateUnit } from "./types.js";

/** The account-door routes, as policy and per-route limits name them. */
export type RouteName = OperationName;

/** Per-minute caps of one scope; an absent field means unlimited. */
export interface RateLimits {
  requestsPerMinute?: number;
  tokensPerMinute?: number;
}

/** The rate limits of a connection. */
export interface ConnectionLimits {
  /** Every key of the connection together. */
  connection: RateLimits;
  /** Each key of the connection on its own. */
  perKey: RateLimits;
  /** Per route, every key of the connection together. */
  routes: Partial<Record<RouteName, RateLimits>>;
}

/** An account as stored. */
export interface AccountRecord {
  accountId: string;
  /** Over every connection and key of the account. */
  limits: RateLimits;
  createdAt: Date;
}

/** The policy of one account connection. */
export interface ConnectionPolicy {
  accountId: string;
  connectionId: string;
  /** Public model ids, in configuration order. */
  models: readonly string[];
  defaultModel: string;
  defaultMaxOutputTokens: number;
  maxOutputTokens: number;
  /** Routes the connection's keys may call; undefined means every route. */
  routes?: readonly RouteName[];
  limits: ConnectionLimits;
  /** Spend cap of every key of the connection together; undefined: none. */
  budget?: Budget;
  createdAt: Date;
}

/** A Virtual Key as stored: never the secret, only its hash and what it grants. */
export interface KeyRecord {
  keyId: string;
  /** SHA-256 of the secret. */
  hash: Buffer;
  accountId: string;
  connectionId: string;
  /** Free-form label; "" when none. */
  name: string;
  createdAt: Date;
  expiresAt?: Date;
  revokedAt?: Date;
  /** The key this one replaced by rotation. */
  rotatedFrom?: string;
  /**
   * The first key of this key's rotation lineage, whose id names the key budget's counter that
   * every key of the lineage spends from (keys.ts, lineageOf); undefined: this key is the first.
   */
  lineageId?: string;
  /** The key that replaced this one. */
  rotatedTo?: string;
  /** Set once rotated: the key works until then. */
  graceEndsAt?: Date;
  /** Last four characters of the secret; "" when only the hash was ever known. */
  last4: string;
  /** The key's own spend cap, on top of its connection's; undefined: none. */
  budget?: Budget;
}

/** Why a key stopped (or will stop) working; each is broadcast so caches drop the key. */
export type DeadlineReason = "revoked" | "rotated" | "expired";

/** A moment at which a key stops working, queued so that it is broadcast once, when due. */
export interface KeyDeadline {
  at: Date;
  reason: DeadlineReason;
  keyId: string;
  /** Lower-case hex SHA-256 of the secret. */
  keyHash: string;
}

/** Why a rotation did not happen. */
export type RotateRefusal = "not_found" | "revoked" | "rotated" | "expired" | "conflict";

/** Where accounts, connections and keys live (Redis across replicas, memory in one process). */
export interface KeyStore {
  /** Finds a key by the SHA-256 of its secret. */
  findByHash(hash: Buffer): Promise<KeyRecord | undefined>;
  /** Finds a key by its id. */
  findById(keyId: string): Promise<KeyRecord | undefined>;
  /** Returns an account. */
  account(accountId: string): Promise<AccountRecord | undefined>;
  /** Returns the policy of a connection. */
  connection(accountId: string, connectionId: string): Promise<ConnectionPolicy | undefined>;
  /** A connection's policy and its account, in one read: what every Authorize needs. */
  policy(
    accountId: string,
    connectionId: string,
  ): Promise<{ connection: ConnectionPolicy; account?: AccountRecord } | undefined>;
  /** Adds an account; false when the id is taken. */
  createAccount(account: AccountRecord): Promise<boolean>;
  /** Adds a connection to an existing account; false when the id is taken. */
  createConnection(connection: ConnectionPolicy): Promise<boolean>;
  /** Creates or replaces an account (configuration import); keeps the first createdAt. */
  putAccount(account: AccountRecord): Promise<void>;
  /** Creates or replaces a connection (configuration import); keeps the first createdAt. */
  putConnection(connection: ConnectionPolicy): Promise<void>;
  /** Stores a new key and its expiry deadline; false when its id or hash exists already. */
  createKey(key: KeyRecord): Promise<boolean>;
  /**
   * Creates or updates a configured key: the configuration owns its connection, name, expiry
   * and budget; revocation and rotation, once set, are never undone; `revoked` can only add one.
   */
  importKey(key: KeyRecord, revoked: boolean): Promise<void>;
  /** Every key of an account, or of one of its connections, oldest first. */
  listKeys(accountId: string, connectionId?: string): Promise<KeyRecord[]>;
  /** Marks a key revoked at `at` unless it already is (the first time stays); undefined if unknown. */
  revokeKey(keyId: string, at: Date): Promise<KeyRecord | undefined>;
  /**
   * Atomically: checks the old key is neither revoked, rotated nor expired at `now`, stores
   * `fresh`, marks the old key rotated to it until `graceEndsAt` and queues that deadline.
   */
  rotateKey(
    oldKeyId: string,
    fresh: KeyRecord,
    graceEndsAt: Date,
    now: Date,
  ): Promise<{ ok: true; old: KeyRecord } | { ok: false; reason: RotateRefusal }>;
  /** Removes and returns up to `limit` deadlines due at `now`; each is handed to one caller only. */
  takeDueDeadlines(now: Date, limit: number): Promise<KeyDeadline[]>;
  /** Queues deadlines (again); the same reason, key and hash is queued once. */
  addDeadlines(deadlines: readonly KeyDeadline[]): Promise<void>;
  /** Every account, ordered by id. */
  listAccounts(): Promise<AccountRecord[]>;
  /** Every connection of an account, ordered by id. */
  listConnections(accountId: string): Promise<ConnectionPolicy[]>;
  /** Removes a connection's policy (its keys stay, as records of revoked keys). */
  deleteConnection(accountId: string, connectionId: string): Promise<void>;
  /** Removes an account's record (delete its connections first). */
  deleteAccount(accountId: string): Promise<void>;
  /** Sets (or, with undefined, removes) a key's own budget; undefined if the key is unknown. */
  setKeyBudget(keyId: string, budget: KeyRecord["budget"]): Promise<KeyRecord | undefined>;
  /** Ids of the keys the configuration file declared at the last import. */
  configKeyIds(): Promise<string[]>;
  /**
   * Replaces the ids of the keys the configuration file declares and, in the same write, marks
   * the store seeded: the last step of a configuration import.
   */
  setConfigKeyIds(ids: readonly string[]): Promise<void>;
  /**
   * Whether a configuration import completed on this store (setConfigKeyIds ran): false on a
   * store that never was seeded or that lost its data (a Redis restarted empty).
   */
  seeded(): Promise<boolean>;
}

/** One rate-limit window a request must fit. */
export interface RateWindow {
  /** Stable identity of the window; windows of one account share the `{accountId}` prefix. */
  id: string;
  scope: RateScope;
  unit: RateUnit;
  /** Units admitted per minute. */
  limit: number;
  /** Units this request uses. */
  cost: number;
}

/** What the counters of one window said. */
export interface WindowCount {
  /** Units counted in the window before this request. */
  used: number;
  /** The newest bucket holding units before this request, -1 when none. */
  newestBucket: number;
  /** When refused: ms until this request would fit; -1 when it never can. 0 when it fits. */
  retryAfterMs: number;
}

/** The outcome of one rate-limit check. */
export interface RateDecision {
  admitted: boolean;
  /** The clock the counters used, in ms since the epoch. */
  nowMs: number;
  /** One per window, in the order given. */
  counts: WindowCount[];
}

/** Counts requests and tokens per window, shared by every replica. */
export interface RateLimiter {
  /**
   * Checks every window and, only if the request fits all of them, counts it in each: a
   * refused request consumes nothing. One atomic step.
   */
  consume(windows: readonly RateWindow[], now: Date): Promise<RateDecision>;
}

/** The quote a request holds against its budgets, if it is admitted. */
export interface HoldRequest {
  /** Names the reservation; settle() takes it. */
  reservationId: string;
  /** The request's quote, held against every budget until settled or expired. */
  amount: bigint;
  budgets: readonly BudgetCheck[];
  /**
   * A lease (docs/money.md, "Leases"), not one request's hold: each settlement names a usage
   * event and charges its cost against the hold, once per event id, instead of ending it;
   * returnLease ends it. Its windows are remembered, so its unused units can be given back.
   */
  lease?: boolean;
}

/** What api-edge says when it returns a lease. */
export interface LeaseReturn {
  /** Base units spent on the lease or held by its requests still in flight. */
  committed: bigint;
  /** Units the lease took and did not use, given back to the bucket they were taken in. */
  unusedRequests: number;
  unusedTokens: number;
  /**
   * The tickets whose cost the edge never learnt: their quotes are in `committed`; each one's
   * hold ends with its charge, whenever it comes.
   */
  unsure: ReadonlyArray<{ ticket: number; quote: bigint }>;
}

/** The outcome of one admission: rate-limit windows and budgets decided together. */
export interface Admission extends RateDecision {
  /** One per budget, in the order given: spend and live holds before this request. */
  budgets: BudgetCount[];
  /** Every budget had room (always true for a peek). */
  budgetsAdmitted: boolean;
  /** Every rate-limit window had room. */
  rateAdmitted: boolean;
}

/** Options of a ledger (memory or Redis). */
export interface LedgerOptions {
  /** How long a hold counts without usage. Default 600 s (RESERVATION_TTL_SECONDS). */
  holdMs?: number;
  /**
   * How long a reservation can be settled, and a period's spend is kept after the period ends.
   * Default 7 days (SETTLEMENT_WINDOW_SECONDS).
   */
  settlementWindowMs?: number;
  /**
   * Told how many reservations' holds were found expired without usage (each reservation once,
   * when its first budget drops the hold); for the reservations metric.
   */
  onHoldsExpired?: (count: number) => void;
  /**
   * Told of each hold that ended by settlement, for the reservations metric: a reservation
   * settled (settled or settled_after_expiry; not a repeat), and a lease, counted as one hold,
   * once the charges on it or its return leave nothing of it held in its first budget. A
   * lease's other charges are not told: its hold ends once, by this or by expiring.
   */
  onHoldSettled?: () => void;
  /**
   * Told of each settlement charged less than it asked because it asked more than was reserved
   * for it (docs/money.md, "Charges"): a reservation above its hold, a lease ticket above what
   * is left of its lease. Once per settlement that charged; a repeat answers the capped cost.
   */
  onOverHold?: (over: OverHold) => void;
}

/** A settlement that asked more than was reserved for it (LedgerOptions.onOverHold). */
export interface OverHold {
  /** "lease" for a lease's ticket (or the lease id itself), else "reservation". */
  kind: "lease" | "reservation";
  /** The id settled (`<lease id>~<n>` for a ticket). */
  reservationId: string;
  eventId: string;
  /** The cost the settlement named. */
  asked: bigint;
  /** What was charged. */
  charged: bigint;
}

/**
 * Rate-limit counters, budget holds and spend, shared by every replica (Redis) or in one
 * process (memory). Reservation holds last the ledger's hold TTL; a reservation can be settled
 * for the ledger's settlement window.
 */
export interface Ledger extends RateLimiter {
  /**
   * One atomic step: checks every rate-limit window and, with `hold`, every budget; only if all
   * of them have room counts the request in each window and holds `hold.amount` against each
   * budget. A refused request consumes and holds nothing. With `peek` instead of `hold`, the
   * budgets are only read (never refused).
   */
  admit(
    windows: readonly RateWindow[],
    budgets: { hold: HoldRequest } | { peek: readonly BudgetCheck[] } | undefined,
    now: Date,
  ): Promise<Admission>;
  /**
   * Settles a reservation at most once: removes its holds and adds `cost` to the spend of the
   * period it was made in, also when the holds have expired. A repeat changes nothing.
   * What is charged never exceeds what was reserved: a reservation's cost is capped at its hold;
   * a lease's tickets together at the lease's allowance, and once it is returned at what the
   * return left to charge (an unsure ticket at its quote). The part not charged is answered as
   * `uncharged` and told to `onOverHold`.
   */
  settle(reservationId: string, cost: bigint, eventId: string, now: Date): Promise<Settlement>;
  /**
   * Settles many reservations, each exactly as settle() would, in the order given (one store
   * round trip or two, however many there are). An item that failed is answered by its Error
   * in its place and leaves the others settled. Optional: without it, settleReservations calls
   * settle() once per item.
   */
  settleMany?(items: readonly SettleItem[], now: Date): Promise<Array<Settlement | Error>>;
  /**
   * Ends a lease (a hold admitted with `lease`): keeps of its hold only what is committed and not
   * yet charged (still to be charged by usage in flight), releases the rest, and gives its unused
   * units back to its windows' bucket if that bucket is still counted. Once only: a repeat, or
   * an id that is no lease, releases nothing.
   */
  returnLease(leaseId: string, back: LeaseReturn, now: Date): Promise<{ released: bigint }>;
}

/** A key that stopped working, as broadcast to every cache in front of auth-policy. */
export interface KeyRevocation {
  /** Lower-case hex SHA-256 of the secret; never the secret. */
  keyHash: string;
  keyId: string;
  revokedAt: Date;
  reason: DeadlineReason;
}

/** Tells every api-edge replica that a key stopped working (core NATS, or memory in one process). */
export interface RevocationPublisher {
  /** Resolves once the broadcast left this process; rejects if it could not. */
  publish(revocation: KeyRevocation): Promise<void>;
}
