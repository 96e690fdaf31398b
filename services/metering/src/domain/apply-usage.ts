import type { ReservationSettler, SettlementOutcome, UsageStore } from "./ports.js";
import type { UsageEvent } from "./usage.js";

/** What applying one event did. */
export interface Applied {
  outcome: "recorded" | "duplicate";
  /** What became of its reservation; undefined when it has none (or no settler is configured). */
  settlement?: SettlementOutcome;
}

/**
 * Applies one usage event exactly once in effect (docs/architecture.md, "The account door, one
 * request", step 5): records it in the rollups (deduplicated by event id), then settles its budget
 * reservation (idempotent by reservation id). The settlement runs for duplicates too, because a
 * delivery that recorded the event may have failed before settling it. Either failure rejects, and
 * the caller must not acknowledge the event: it is delivered again and both steps repeat
 * harmlessly.
 */
export async function applyUsage(
  event: UsageEvent,
  store: UsageStore,
  settler?: ReservationSettler,
): Promise<Applied> {
  const outcome = await store.record(event);
  if (!event.reservationId || !settler) return { outcome };
  const settlement = await settler.settle(event.reservationId, event.cost, event.eventId);
  return { outcome, settlement };
}
