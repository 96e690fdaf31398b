import type {
  PaidCommitItem,
  PaidCommitOutcome,
  PaidCommitter,
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
      /** What became of its paid hold; undefined when it has none (or no committer is configured). */
      paidCommit?: PaidCommitOutcome;
    }
  /** Not done (not recorded, or recorded but its reservation or hold not charged): deliver it again. */
  | { failed: Error; stage: "record" | "settle" | "commit"; outcome?: RecordOutcome };

/** Where the charges of a batch go besides the rollups: auth-policy's budgets, mpp-payment's holds. */
export interface Charging {
  settler?: ReservationSettler | undefined;
  committer?: PaidCommitter | undefined;
}

/** Most paid-hold commits of one batch in flight at once. */
export const PAID_COMMITS_IN_FLIGHT = 16;

const asError = (err: unknown): Error => (err instanceof Error ? err : new Error(String(err)));

/** `fn` over every item, at most `limit` at a time; each answer (or its error) in its item's place. */
async function eachBounded<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<Array<R | Error>> {
  const out = new Array<R | Error>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!).catch(asError);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/**
 * Applies a batch of usage events exactly once in effect (docs/architecture.md, "The account
 * door, one request", step 5, and "Metering in batches"): records them all in the rollups in one
 * store round trip (deduplicated by event id), then, together, settles all their budget
 * reservations in one call and commits their paid holds (a few at a time); both are idempotent
 * by reservation id, and a reservation named twice in the batch is sent once. Settling and
 * committing run for duplicates too, because a delivery that recorded an event may have failed
 * before charging it. An event whose recording, settlement or commit failed is answered as
 * failed and must not be acknowledged: it is delivered again and every step repeats harmlessly.
 * A hold mpp-payment will never charge (unknown, released, expired) is an answer, not a failure.
 * Rejects only when the store could say nothing of any event (then none may be acknowledged).
 */
export async function applyUsageBatch(
  events: readonly UsageEvent[],
  store: UsageStore,
  { settler, committer }: Charging = {},
): Promise<Applied[]> {
  if (events.length === 0) return [];
  const recorded = await store.recordMany(events);
  const slot = new Map<string, number>();
  const items: SettleItem[] = [];
  const paidSlot = new Map<string, number>();
  const paid: PaidCommitItem[] = [];
  events.forEach((e, i) => {
    if (recorded[i] instanceof Error) return;
    if (settler && e.reservationId && !slot.has(e.reservationId)) {
      slot.set(e.reservationId, items.length);
      items.push({ reservationId: e.reservationId, cost: e.cost, eventId: e.eventId });
    }
    if (committer && e.paidHold && !paidSlot.has(e.paidHold.reservationId)) {
      paidSlot.set(e.paidHold.reservationId, paid.length);
      paid.push({ ...e.paidHold, cost: e.cost });
    }
  });
  const settle = async (): Promise<Array<SettlementOutcome | Error>> => {
    if (!settler || items.length === 0) return [];
    try {
      return await settler.settleMany(items);
    } catch (err) {
      return items.map(() => asError(err));
    }
  };
  const commit = async (): Promise<Array<PaidCommitOutcome | Error>> =>
    committer && paid.length > 0 ? eachBounded(paid, PAID_COMMITS_IN_FLIGHT, (p) => committer.commit(p)) : [];
  const [settled, committed] = await Promise.all([settle(), commit()]);
  return events.map((e, i): Applied => {
    const outcome = recorded[i] ?? new Error("the store answered too few events");
    if (outcome instanceof Error) return { failed: outcome, stage: "record" };
    const applied: Applied = { outcome };
    const k = e.reservationId ? slot.get(e.reservationId) : undefined;
    if (k !== undefined) {
      const settlement = settled[k] ?? new Error("the settler answered too few items");
      if (settlement instanceof Error) return { failed: settlement, stage: "settle", outcome };
      applied.settlement = settlement;
    }
    const p = e.paidHold ? paidSlot.get(e.paidHold.reservationId) : undefined;
    if (p !== undefined) {
      const paidCommit = committed[p] ?? new Error("the committer answered too few items");
      if (paidCommit instanceof Error) return { failed: paidCommit, stage: "commit", outcome };
      applied.paidCommit = paidCommit;
    }
    return applied;
  });
}
