/**
 * Ids remembered for a fixed time after they were first seen: the duplicate window of the
 * in-memory bus's msgIds and of the in-memory usage store's event ids. Under sustained load
 * these hold every id of the window, so each costs as little as the set's own entry and its
 * string: the expiries sit in an unboxed array of doubles beside the ids in arrival order, not
 * in an object per id with a boxed number, and the expired ones are forgotten from the front,
 * in chunks, never walking the live ones.
 *
 * `now` should not go backwards; when the clock does, an id is remembered longer, never shorter.
 */
export class ExpiringIds {
  readonly #ids = new Set<string>();
  // order[i] was added at position first + i and expires at expires[i] (nondecreasing while
  // the clock is); an id leaves the set only when its own position is forgotten, so each id in
  // the set has exactly one position, and re-adding one after it expired starts a new one.
  #order: string[] = [];
  #expires: number[] = [];
  #first = 0;

  constructor(private readonly ttlMs: number) {}

  /** How many ids are remembered. */
  get size(): number {
    return this.#ids.size;
  }

  /** Whether `id` is remembered at `now` (seen less than the time to live ago). */
  has(id: string, now: number): boolean {
    this.forget(now);
    return this.#ids.has(id);
  }

  /** Remembers `id` from `now` on; false (and nothing changes) when it is remembered already. */
  add(id: string, now: number): boolean {
    if (this.has(id, now)) return false;
    this.#ids.add(id);
    this.#order.push(id);
    this.#expires.push(now + this.ttlMs);
    return true;
  }

  /** Forgets the ids whose time to live has passed at `now`. */
  forget(now: number): void {
    const order = this.#order;
    const expires = this.#expires;
    let first = this.#first;
    while (first < order.length && expires[first]! <= now) this.#ids.delete(order[first++]!);
    // Drops the forgotten positions in chunks: amortised O(1) per id.
    if (first >= 1_024 && first * 2 >= order.length) {
      this.#order = order.slice(first);
      this.#expires = expires.slice(first);
      first = 0;
    }
    this.#first = first;
  }
}
