import { decide } from "@tollgate/kit/credentials";
import { describe, expect, it } from "vitest";
import { authAccess } from "./access.js";

describe("authAccess", () => {
  it("lets metering alone settle reservations in batches", () => {
    expect(decide(authAccess, "settleReservations", "metering")).toBe("allow");
    expect(decide(authAccess, "settleReservations", "api-edge")).toBe("permission_denied");
    expect(decide(authAccess, "settleReservations", "inference-router")).toBe("permission_denied");
    expect(decide(authAccess, "settleReservations", undefined)).toBe("unauthenticated");
  });
});
