import type { CooldownBroadcast, CooldownNotice } from "../domain/ports.js";

/** One process's cooldown broadcast (the all-in-one process without NATS, tests). */
export interface MemoryCooldownBroadcast {
  /** A replica's view: it hears every other replica's notices, never its own. */
  replica(): CooldownBroadcast;
}

/** Creates an in-process broadcast; a throwing subscriber does not stop the others. */
export function createMemoryCooldownBroadcast(): MemoryCooldownBroadcast {
  const handlers = new Map<(notice: CooldownNotice) => void, object>();
  return {
    replica() {
      const self = {};
      return {
        publish(notice) {
          for (const [handler, owner] of [...handlers]) {
            if (owner === self) continue;
            try {
              handler(notice);
            } catch {
              // A subscriber's failure is its own; the notice still reaches the others.
            }
          }
        },
        subscribe(handler) {
          handlers.set(handler, self);
          return () => handlers.delete(handler);
        },
      };
    },
  };
}
