// The KeyRevoked broadcast on core NATS (subject natsNames(ns).keyRevoked): protobuf
// tollgate.auth.v1.KeyRevoked, naming the key by the hex SHA-256 of its secret. api-edge decodes
// it with the same generated schema (`decodeMessage(KeyRevokedSchema, msg.data)`); this module is
// the codec and a subscriber for auth-policy and its tests.

import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { NatsConnection } from "@tollgate/kit/nats";
import { KeyRevokedReason, KeyRevokedSchema } from "@tollgate/proto/auth";
import { decodeMessage, encodeMessage } from "@tollgate/proto/codec";
import type { DeadlineReason, KeyRevocation } from "../../domain/ports.js";

const TO_WIRE = {
  revoked: KeyRevokedReason.REVOKED,
  rotated: KeyRevokedReason.ROTATED,
  expired: KeyRevokedReason.EXPIRED,
} satisfies Record<DeadlineReason, KeyRevokedReason>;

const FROM_WIRE: Partial<Record<KeyRevokedReason, DeadlineReason>> = {
  [KeyRevokedReason.REVOKED]: "revoked",
  [KeyRevokedReason.ROTATED]: "rotated",
  [KeyRevokedReason.EXPIRED]: "expired",
};

/** Encodes a revocation as a KeyRevoked protobuf message. */
export function encodeKeyRevoked(r: KeyRevocation): Uint8Array {
  return encodeMessage(KeyRevokedSchema, {
    keyHash: r.keyHash,
    keyId: r.keyId,
    revokedAt: timestampFromDate(r.revokedAt),
    reason: TO_WIRE[r.reason],
  });
}

/** Decodes a KeyRevoked protobuf message; an unknown reason reads as "revoked". */
export function decodeKeyRevoked(data: Uint8Array): KeyRevocation {
  const m = decodeMessage(KeyRevokedSchema, data);
  return {
    keyHash: m.keyHash,
    keyId: m.keyId,
    revokedAt: m.revokedAt ? timestampDate(m.revokedAt) : new Date(0),
    reason: FROM_WIRE[m.reason] ?? "revoked",
  };
}

/**
 * Calls `handler` for every KeyRevoked on `subject`; undecodable messages are skipped. Returns
 * the unsubscribe. Core NATS: only subscribers connected at publish time receive a broadcast,
 * which is what a cache needs (a replica that starts later has an empty cache).
 */
export function subscribeRevocations(
  nc: NatsConnection,
  subject: string,
  handler: (revocation: KeyRevocation) => void,
): () => void {
  const sub = nc.subscribe(subject, {
    callback: (err, msg) => {
      if (err) return;
      let revocation: KeyRevocation;
      try {
        revocation = decodeKeyRevoked(msg.data);
      } catch {
        return;
      }
      handler(revocation);
    },
  });
  return () => sub.unsubscribe();
}
