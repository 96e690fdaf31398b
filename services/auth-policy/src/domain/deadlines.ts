import type { KeyStore, RevocationPublisher } from "./ports.js";

/** The publisher (NATS) failed to broadcast a due deadline; it was queued again. */
export class DeadlineBroadcastError extends Error {
  constructor(cause: unknown) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = "DeadlineBroadcastError";
  }
}

/**
 * Broadcasts every key deadline that is due (rotation grace ended, expiry reached, revocations
 * queued at import), so caches drop those keys. Each deadline is taken by one replica only; one
 * that could not be broadcast is queued again and a DeadlineBroadcastError thrown; an error of
 * the store (taking or queueing deadlines again) is thrown as it is. Returns how many were
 * broadcast.
 */
export async function broadcastDueDeadlines(
  store: KeyStore,
  publisher: RevocationPublisher,
  now = new Date(),
  batch = 100,
): Promise<number> {
  const due = await store.takeDueDeadlines(now, batch);
  for (let i = 0; i < due.length; i++) {
    const d = due[i]!;
    try {
      await publisher.publish({ keyHash: d.keyHash, keyId: d.keyId, revokedAt: d.at, reason: d.reason });
    } catch (err) {
      await store.addDeadlines(due.slice(i));
      throw new DeadlineBroadcastError(err);
    }
  }
  return due.length;
}
