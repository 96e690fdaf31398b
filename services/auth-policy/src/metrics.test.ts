import { create } from "@bufbuild/protobuf";
import { GrpcStatus, type Handlers, StatusError } from "@tollgate/kit/grpc";
import { createMetrics } from "@tollgate/kit/metrics";
import {
  AcquireLeaseRequestSchema,
  AuthorizeRequestSchema,
  type AuthService,
  RATE_LIMIT_DETAILS,
  SettleOutcome,
  SettleReservationsRequestSchema,
} from "@tollgate/proto/auth";
import { describe, expect, it } from "vitest";
import { type AuthMetrics, authMetrics, countAuthCalls } from "./metrics.js";

const ctx = { signal: new AbortController().signal, metadata: undefined as never };

async function reservations(m: AuthMetrics): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const v of (await m.reservations.get()).values) out[String(v.labels["outcome"])] = v.value;
  return out;
}

/** Handlers that throw, but for the given ones. */
function handlersWith(some: Partial<Handlers<typeof AuthService>>): Handlers<typeof AuthService> {
  const never = async (): Promise<never> => {
    throw new Error("not called");
  };
  return {
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
    settleReservations: never,
    ...some,
  } satisfies Handlers<typeof AuthService>;
}

/** A handler that throws `errors` in turn, one per call. */
const throwing = (errors: Error[]) => async (): Promise<never> => {
  throw errors.shift();
};

describe("countAuthCalls", () => {
  it("leaves settled holds to the budget code: a SettleReservations call counts none (a lease's charges are not its hold's end)", async () => {
    const m = authMetrics(createMetrics("auth-policy", { processMetrics: false }));
    const handlers = handlersWith({
      settleReservations: async () => ({
        results: [
          { outcome: SettleOutcome.SETTLED, settledCost: "1", errorCode: "" },
          { outcome: SettleOutcome.ALREADY_SETTLED, settledCost: "1", errorCode: "" },
          { outcome: SettleOutcome.SETTLED_AFTER_EXPIRY, settledCost: "2", errorCode: "" },
          { outcome: SettleOutcome.UNKNOWN_RESERVATION, settledCost: "", errorCode: "" },
          { outcome: SettleOutcome.UNSPECIFIED, settledCost: "", errorCode: "store_unavailable" },
        ],
      }),
    });
    const counted = countAuthCalls(handlers, m);
    await counted.settleReservations(create(SettleReservationsRequestSchema, {}), ctx);
    expect((await reservations(m))["settled"]).toBe(0);
    expect((await m.calls.get()).values.find((v) => v.labels["method"] === "settleReservations")?.value).toBe(
      1,
    );
  });

  it("counts a lease granted with a budget allowance as one hold reserved, and no other lease", async () => {
    const m = authMetrics(createMetrics("auth-policy", { processMetrics: false }));
    const answers = [
      { granted: true, leaseId: "rsv_a", budget: "400" },
      { granted: true, leaseId: "rsv_b", budget: "" },
      { granted: false, leaseId: "", budget: "" },
      { granted: true, leaseId: "rsv_c", budget: "90" },
    ];
    const counted = countAuthCalls(handlersWith({ acquireLease: async () => answers.shift() as never }), m);
    for (let i = 0; i < 4; i++) await counted.acquireLease(create(AcquireLeaseRequestSchema, {}), ctx);
    expect(await reservations(m)).toMatchObject({ reserved: 2, settled: 0, expired: 0 });
    m.reservation("settled");
    expect((await reservations(m))["settled"]).toBe(1);
  });

  it("counts a lease refused for budget as a hold refused, and a lease refused by a rate limit by its scope, as Authorize's", async () => {
    const m = authMetrics(createMetrics("auth-policy", { processMetrics: false }));
    const errors = [
      new StatusError(GrpcStatus.FAILED_PRECONDITION, "budget_exceeded", "no room"),
      new StatusError(GrpcStatus.RESOURCE_EXHAUSTED, "rate_limited", "slow down", {
        [RATE_LIMIT_DETAILS.scope]: "key",
      }),
    ];
    const counted = countAuthCalls(handlersWith({ acquireLease: throwing(errors) }), m);
    for (let i = 0; i < 2; i++)
      await counted.acquireLease(create(AcquireLeaseRequestSchema, {}), ctx).catch(() => undefined);
    expect(await reservations(m)).toMatchObject({ reserved: 0, refused: 1 });
    expect((await m.rateLimited.get()).values.map((v) => [v.labels["scope"], v.value])).toEqual([["key", 1]]);
  });

  it("labels an Authorize that could not reach Redis unavailable (a 503), not internal (a 500)", async () => {
    const m = authMetrics(createMetrics("auth-policy", { processMetrics: false }));
    const errors = [new Error("Connection is closed."), new Error("a bug")];
    const counted = countAuthCalls(handlersWith({ authorize: throwing(errors) }), m);
    for (let i = 0; i < 2; i++)
      await counted.authorize(create(AuthorizeRequestSchema, {}), ctx).catch(() => undefined);
    const outcomes = (await m.authorize.get()).values.map((v) => v.labels["outcome"]);
    expect(outcomes.sort()).toEqual(["internal", "unavailable"]);
  });
});
