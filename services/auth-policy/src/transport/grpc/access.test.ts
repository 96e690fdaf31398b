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

describe("authAccess of the admin RPCs", () => {
  it("lets api-edge alone list, show, update and delete accounts, connections and keys", () => {
    for (const method of [
      "listAccounts",
      "getAccount",
      "updateAccount",
      "deleteAccount",
      "getConnection",
      "updateConnection",
      "deleteConnection",
      "getKey",
      "updateKey",
    ] as const) {
      expect(decide(authAccess, method, "api-edge")).toBe("allow");
      expect(decide(authAccess, method, "metering")).toBe("permission_denied");
    }
  });
});
