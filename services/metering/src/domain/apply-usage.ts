import type {
  RecordOutcome,
  ReservationSettler,
  SettleItem,
  SettlementOutcome,
  UsageStore,
} from "./ports.js";
import type { UsageEvent } from "./usage.js";

/** What applying one event of a batch did. */
export type Applied =
  | {
      outcome: RecordOutcome;
      /** What became of its reservation; undefined when it has none (or no settler is configured). */
      settlement?: SettlementOutcome;
    }
  /** Not done (not recorded, or recorded but its reservation not settled): deliver it again. */
  | { failed: Error; stage: "record" | "settle"; outcome?: RecordOutcome };

const asError = (err: unknown): Error => (err instanceof Error ? err : new Error(String(err)));

/**
 * Applies a batch of usage events exactly once in effect (docs/architecture.md, "The account
 * door, one request", step 5, and "Metering in batches"): records them all in the rollups in one
 * store round trip (deduplicated by event id), then settles all their budget reservations in
 * one call (idempotent by reservation id; a reservation named twice in the batch is sent once).
 * The settlement runs for duplicates too, because a delivery that recorded an event may have
 * failed before settling it. An event whose recording or settlement failed is answered as
 * failed and must not be acknowledged: it is delivered again and both steps repeat harmlessly.
 * Rejects only when the store could say nothing of any event (then none may be acknowledged).
 */
export async function applyUsageBatch(
  events: readonly UsageEvent[],
  store: UsageStore,
  settler?: ReservationSettler,
): Promise<Applied[]> {
  if (events.length === 0) return [];
  const recorded = await store.recordMany(events);
  const slot = new Map<string, number>();
  const items: SettleItem[] = [];
  events.forEach((e, i) => {
    if (!settler || !e.reservationId || recorded[i] instanceof Error || slot.has(e.reservationId)) return;
    slot.set(e.reservationId, items.length);
    items.push({ reservationId: e.reservationId, cost: e.cost, eventId: e.eventId });
  });
  let settled: Array<SettlementOutcome | Error> = [];
  if (settler && items.length > 0) {
    try {
      settled = await settler.settleMany(items);
    } catch (err) {
      settled = items.map(() => asError(err));
    }
  }
  return events.map((e, i): Applied => {
    const outcome = recorded[i] ?? new Error("the store answered too few events");
    if (outcome instanceof Error) return { failed: outcome, stage: "record" };
    const k = e.reservationId ? slot.get(e.reservationId) : undefined;
    if (k === undefined) return { outcome };
    const settlement = settled[k] ?? new Error("the settler answered too few items");
    if (settlement instanceof Error) return { failed: settlement, stage: "settle", outcome };
    return { outcome, settlement };
  });
}
