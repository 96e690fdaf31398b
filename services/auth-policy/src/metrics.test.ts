import { create } from "@bufbuild/protobuf";
import type { Handlers } from "@tollgate/kit/grpc";
import { createMetrics } from "@tollgate/kit/metrics";
import { type AuthService, SettleOutcome, SettleReservationsRequestSchema } from "@tollgate/proto/auth";
import { describe, expect, it } from "vitest";
import { authMetrics, countAuthCalls } from "./metrics.js";

describe("countAuthCalls", () => {
  it("counts each reservation a SettleReservations call settled, and nothing else of it", async () => {
    const registry = createMetrics("auth-policy", { processMetrics: false });
    const m = authMetrics(registry);
    const never = async (): Promise<never> => {
      throw new Error("not called");
    };
    const handlers = {
      authorize: never,
      createAccount: never,
      createConnection: never,
      createKey: never,
      listKeys: never,
      revokeKey: never,
      rotateKey: never,
      listAccounts: never,
      getAccount: never,
      updateAccount: never,
      deleteAccount: never,
      getConnection: never,
      updateConnection: never,
      deleteConnection: never,
      getKey: never,
      updateKey: never,
      settleReservation: never,
      acquireLease: never,
      returnLease: never,
      settleReservations: async () => ({
        results: [
          { outcome: SettleOutcome.SETTLED, settledCost: "1", errorCode: "" },
          { outcome: SettleOutcome.ALREADY_SETTLED, settledCost: "1", errorCode: "" },
          { outcome: SettleOutcome.SETTLED_AFTER_EXPIRY, settledCost: "2", errorCode: "" },
          { outcome: SettleOutcome.UNKNOWN_RESERVATION, settledCost: "", errorCode: "" },
          { outcome: SettleOutcome.UNSPECIFIED, settledCost: "", errorCode: "store_unavailable" },
        ],
      }),
    } satisfies Handlers<typeof AuthService>;
    const counted = countAuthCalls(handlers, m);
    await counted.settleReservations(create(SettleReservationsRequestSchema, {}), {
      signal: new AbortController().signal,
      metadata: undefined as never,
    });
    const settled = (await m.reservations.get()).values.find((v) => v.labels["outcome"] === "settled");
    expect(settled?.value).toBe(2);
  });
});
