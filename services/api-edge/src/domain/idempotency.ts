/** A response kept for replay under an Idempotency-Key. */
export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

/** What to do with a request that carries an Idempotency-Key. */
export type IdempotencyDecision =
  /** First time (or the earlier attempt failed): run it, then complete() or abandon(). */
  | { kind: "run" }
  /** Done before with the same body: send the stored response. */
  | { kind: "replay"; response: StoredResponse }
  /** Used before with a different body. */
  | { kind: "conflict" }
  /** The same request is running right now elsewhere. */
  | { kind: "in_progress" };

/**
 * Where idempotency records live: Redis shared by every api-edge replica, or memory in the
 * all-in-one process. `begin` is atomic: of concurrent duplicates exactly one gets "run".
 */
export interface IdempotencyStore {
  /**
   * Claims `id` for a body `fingerprint` on behalf of `owner` (a token of the one request that
   * runs); the claim lapses after `leaseMs` if never renewed or completed.
   */
  begin(id: string, fingerprint: string, owner: string, leaseMs: number): Promise<IdempotencyDecision>;
  /** Keeps `owner`'s running claim for `leaseMs` more; nothing once it is done, gone or another's. */
  renew(id: string, fingerprint: string, owner: string, leaseMs: number): Promise<void>;
  /**
   * Stores the response of `owner`'s request for `ttlMs`: over its own running claim, or where
   * no record is left (its claim lapsed and nobody took it over); never over a stored response
   * or a claim another request took after `owner`'s lapsed.
   */
  complete(
    id: string,
    fingerprint: string,
    owner: string,
    response: StoredResponse,
    ttlMs: number,
  ): Promise<void>;
  /** Drops `owner`'s claim, its request having failed, so a retry can run; never another's. */
  abandon(id: string, fingerprint: string, owner: string): Promise<void>;
}

/** How long a stored response is replayed (docs/contract.md, "Idempotency": within 24 h). */
export const IDEMPOTENCY_TTL_MS = 24 * 60 * 60 * 1000;
/** How long a duplicate waits for the running request; longer than the slowest buffered completion. */
export const IDEMPOTENCY_WAIT_MS = 5 * 60 * 1000;
/**
 * How long a running request's claim outlives its last renewal. The api-edge running it renews
 * it every IDEMPOTENCY_RENEW_MS, so a claim whose api-edge died (killed, its node lost) lapses
 * within this and a retry of the request runs, instead of waiting IDEMPOTENCY_WAIT_MS for
 * 409 `idempotency_in_progress` (docs/account-door.md, "Rate limits and idempotency").
 */
export const IDEMPOTENCY_CLAIM_MS = 10_000;
export const IDEMPOTENCY_RENEW_MS = 3_000;
/** Accepted Idempotency-Key values. */
export const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;
