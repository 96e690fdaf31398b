import type { NatsConnection } from "@tollgate/kit/nats";
import { decodeMessage, encodeMessage } from "@tollgate/proto/codec";
import { CooldownReason, UpstreamCooledDownSchema } from "@tollgate/proto/inference";
import type { CooldownBroadcast, CooldownNotice } from "../domain/ports.js";

const TO_WIRE = {
  failures: CooldownReason.FAILURES,
  retry_after: CooldownReason.RETRY_AFTER,
} satisfies Record<CooldownNotice["reason"], CooldownReason>;

/** Encodes a notice as UpstreamCooledDown, naming the replica that sends it. */
export function encodeCooldown(notice: CooldownNotice, origin: string): Uint8Array {
  return encodeMessage(UpstreamCooledDownSchema, {
    upstreamId: notice.upstreamId,
    durationMs: Math.min(Math.max(0, Math.round(notice.durationMs)), 0xffffffff),
    reason: TO_WIRE[notice.reason],
    origin,
  });
}

/** Decodes UpstreamCooledDown; an unknown reason reads as "failures". */
export function decodeCooldown(data: Uint8Array): CooldownNotice & { origin: string } {
  const m = decodeMessage(UpstreamCooledDownSchema, data);
  return {
    upstreamId: m.upstreamId,
    durationMs: m.durationMs,
    reason: m.reason === CooldownReason.RETRY_AFTER ? "retry_after" : "failures",
    origin: m.origin,
  };
}

/**
 * Cooldowns over core NATS: every replica subscribed at publish time hears them, none asks for
 * them on the request path. A replica that starts later finds out by itself, from its own
 * failures. `origin` (random per replica) lets a replica skip its own notices.
 */
export function createNatsCooldownBroadcast(
  nc: NatsConnection,
  subject: string,
  origin: string,
): CooldownBroadcast {
  return {
    publish(notice) {
      nc.publish(subject, encodeCooldown(notice, origin));
    },
    subscribe(handler) {
      const sub = nc.subscribe(subject, {
        callback: (err, msg) => {
          if (err) return;
          let notice: ReturnType<typeof decodeCooldown>;
          try {
            notice = decodeCooldown(msg.data);
          } catch {
            return;
          }
          if (notice.origin !== origin)
            handler({ upstreamId: notice.upstreamId, durationMs: notice.durationMs, reason: notice.reason });
        },
      });
      return () => sub.unsubscribe();
    },
  };
}
