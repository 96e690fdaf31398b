import type { KeyRevocation, RevocationPublisher } from "../domain/ports.js";

/** An in-process revocation broadcaster with subscribers: the all-in-one process's NATS. */
export interface MemoryRevocationBus extends RevocationPublisher {
  /** Calls `handler` for every revocation published from now on; returns the unsubscribe. */
  subscribe(handler: (revocation: KeyRevocation) => void): () => void;
}

/** Creates an in-process revocation broadcaster; a throwing subscriber does not stop the others. */
export function createMemoryRevocationBus(): MemoryRevocationBus {
  const handlers = new Set<(revocation: KeyRevocation) => void>();
  return {
    async publish(revocation) {
      for (const handler of [...handlers]) {
        try {
          handler(revocation);
        } catch {
          // A subscriber's failure is its own; the broadcast still reaches the others.
        }
      }
    },
    subscribe(handler) {
      handlers.add(handler);
      return () => handlers.delete(handler);
    },
  };
}
