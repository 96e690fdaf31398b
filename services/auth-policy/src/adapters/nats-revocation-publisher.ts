import type { NatsConnection } from "@tollgate/kit/nats";
import type { RevocationPublisher } from "../domain/ports.js";
import { encodeKeyRevoked } from "../transport/nats/revocations.js";

/** How long a broadcast may take to reach the NATS server before it counts as failed. */
const FLUSH_TIMEOUT_MS = 2_000;

/**
 * Broadcasts revocations on core NATS. publish() resolves once the server has the message
 * (flush round trip), so a RevokeKey that returns has reached every connected subscriber's server.
 */
export function createNatsRevocationPublisher(nc: NatsConnection, subject: string): RevocationPublisher {
  return {
    async publish(revocation) {
      nc.publish(subject, encodeKeyRevoked(revocation));
      let timer: NodeJS.Timeout | undefined;
      try {
        await Promise.race([
          nc.flush(),
          new Promise<never>((_, reject) => {
            timer = setTimeout(() => reject(new Error("NATS flush timed out")), FLUSH_TIMEOUT_MS);
          }),
        ]);
      } finally {
        clearTimeout(timer);
      }
    },
  };
}
