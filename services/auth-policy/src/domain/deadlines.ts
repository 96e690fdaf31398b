import type { KeyStore, RevocationPublisher } from "./ports.js";

/**
 * Broadcasts every key deadline that is due (rotation grace ended, expiry reached, revocations
 * queued at import), so caches drop those keys. Each deadline is taken by one replica only; one
 * that could not be broadcast is queued again. Returns how many were broadcast.
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
      throw err;
    }
  }
  return due.length;
}
