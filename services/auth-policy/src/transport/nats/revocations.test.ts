import { fromBinary } from "@bufbuild/protobuf";
import { KeyRevokedReason, KeyRevokedSchema } from "@tollgate/proto/auth";
import { describe, expect, it } from "vitest";
import type { KeyRevocation } from "../../domain/ports.js";
import { decodeKeyRevoked, encodeKeyRevoked } from "./revocations.js";

describe("KeyRevoked codec", () => {
  it("round-trips every reason and is plain tollgate.auth.v1.KeyRevoked on the wire", () => {
    for (const reason of ["revoked", "rotated", "expired"] as const) {
      const r: KeyRevocation = {
        keyHash: "ab".repeat(32),
        keyId: "key_1",
        revokedAt: new Date("2025-06-01T12:00:00.123Z"),
        reason,
      };
      const bytes = encodeKeyRevoked(r);
      expect(decodeKeyRevoked(bytes)).toEqual(r);
      const wire = fromBinary(KeyRevokedSchema, bytes);
      expect(wire.keyHash).toBe(r.keyHash);
      expect(wire.reason).not.toBe(KeyRevokedReason.UNSPECIFIED);
    }
  });
});
