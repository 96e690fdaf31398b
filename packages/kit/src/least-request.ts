// The load balancing every gRPC client of the gateway uses across a service's replicas
// (the Channel of channel.ts calls `choose` for each call;
// docs/architecture.md, "Spreading calls over replicas"): each call goes to the ready replica
// with the fewest calls in flight from this client; among equals, to the preferred one, which
// moves to the next replica every PREFERENCE_MS, from an order shuffled once per address list
// so that clients prefer different replicas.
//
// Round-robin sent every other call to another replica even when one at a time was in flight,
// so at low load each replica woke for every second call with its caches cold: on the 2-core
// bench, one router taking the calls of one connection instead of two cut 0.2–0.6 ms off a
// request and about a quarter of the routers' CPU per request (docs/performance.md, "Least
// calls in flight"). Under load the counts even out, and a replica that falls behind gets
// fewer calls, not its share. The preference moves so that, at low load too, every replica
// keeps receiving calls (an idle replica's broken connection shows, and the alert for a
// replica that gets no calls keeps its meaning).
//
// A replica whose call ended UNAVAILABLE is passed over for FAILED_HOLD_MS while another is
// ready, so one that fails fast (and so has nothing in flight) does not draw every call.

/** How long a replica whose call ended UNAVAILABLE is passed over while another is ready. */
export const FAILED_HOLD_MS = 1_000;

/** How long one replica stays the preferred one among equals before the next one is. */
export const PREFERENCE_MS = 5_000;

/** What the choice reads of a replica: this client's calls on it, and its last failure. */
export interface Load {
  /** Calls of this client on it, started and not ended. */
  inFlight: number;
  /** When a call on it last ended UNAVAILABLE or a connection to it failed (ms since the epoch); 0: never. */
  failedAt: number;
}

/**
 * Picks the ready replica to run a call on at `now`: the fewest in flight among those that did
 * not fail within FAILED_HOLD_MS (among all when every one did); among equals, the first from
 * the preferred one on, which is `ready`'s next entry every PREFERENCE_MS.
 */
export function choose<R extends Load>(ready: readonly R[], now: number): R | undefined {
  const n = ready.length;
  const first = Math.floor(now / PREFERENCE_MS) % n;
  let best: R | undefined;
  let bestFailing = true;
  for (let i = 0; i < n; i++) {
    const r = ready[(first + i) % n]!;
    const failing = now - r.failedAt < FAILED_HOLD_MS;
    if (
      best === undefined ||
      (bestFailing && !failing) ||
      (failing === bestFailing && r.inFlight < best.inFlight)
    ) {
      best = r;
      bestFailing = failing;
    }
  }
  return best;
}
