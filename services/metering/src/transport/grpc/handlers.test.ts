import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type CallContext, GrpcStatus, StatusError } from "@tollgate/kit/grpc";
import {
  GetUsageRequestSchema,
  GetUsageResponseSchema,
  Granularity,
  RecordUsageRequestSchema,
} from "@tollgate/proto/metering";
import { Door, type UsageRecorded, UsageRecordedSchema } from "@tollgate/proto/usage";
import { describe, expect, it } from "vitest";
import { usageEvent } from "../../../test/usage-store-contract.js";
import { createMemoryUsageStore } from "../../adapters/memory-usage-store.js";
import { meteringHandlers } from "./handlers.js";

const now = new Date("2025-03-10T12:30:00Z");
// The handler reads no metadata.
const ctx = { signal: new AbortController().signal } as CallContext;

async function setup() {
  const store = createMemoryUsageStore();
  await store.record(usageEvent({ occurredAt: new Date("2025-03-10T11:10:00Z"), cost: 7n, model: "big" }));
  await store.record(usageEvent({ occurredAt: new Date("2025-03-10T12:10:00Z"), cost: 5n }));
  await store.record(usageEvent({ occurredAt: new Date("2025-03-08T12:10:00Z"), cost: 1000n }));
  return meteringHandlers(store, () => now);
}

async function statusOf(p: Promise<unknown>) {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(StatusError);
  const s = err as StatusError;
  return { status: s.status, code: s.code };
}

describe("GetUsage handler", () => {
  it("defaults to the last 24 hours in hourly buckets", async () => {
    const h = await setup();
    const res = create(GetUsageResponseSchema, await h.getUsage(create(GetUsageRequestSchema, {}), ctx));
    expect(res.totals).toMatchObject({
      requests: 2n,
      inputTokens: 200n,
      outputTokens: 40n,
      reasoningTokens: 10n,
      cost: "12",
    });
    expect(res.buckets?.map((b) => [timestampDate(b.start!).toISOString(), b.totals?.cost])).toEqual([
      ["2025-03-10T11:00:00.000Z", "7"],
      ["2025-03-10T12:00:00.000Z", "5"],
    ]);
  });

  it("applies filters, range and daily granularity", async () => {
    const h = await setup();
    const res = create(
      GetUsageResponseSchema,
      await h.getUsage(
        create(GetUsageRequestSchema, {
          model: "small",
          from: timestampFromDate(new Date("2025-03-01T00:00:00Z")),
          to: timestampFromDate(new Date("2025-03-11T00:00:00Z")),
          granularity: Granularity.DAY,
        }),
        ctx,
      ),
    );
    expect(res.totals?.cost).toBe("1005");
    expect(res.buckets?.map((b) => timestampDate(b.start!).toISOString())).toEqual([
      "2025-03-08T00:00:00.000Z",
      "2025-03-10T00:00:00.000Z",
    ]);
  });

  it("refuses too wide a range and a reversed one with INVALID_ARGUMENT", async () => {
    const h = await setup();
    const wide = create(GetUsageRequestSchema, {
      from: timestampFromDate(new Date("2025-01-01T00:00:00Z")),
      to: timestampFromDate(new Date("2025-03-01T00:00:00Z")),
      granularity: Granularity.HOUR,
    });
    expect(await statusOf(h.getUsage(wide, ctx))).toEqual({
      status: GrpcStatus.INVALID_ARGUMENT,
      code: "time_range_too_large",
    });
    const reversed = create(GetUsageRequestSchema, {
      from: timestampFromDate(new Date("2025-03-02T00:00:00Z")),
      to: timestampFromDate(new Date("2025-03-01T00:00:00Z")),
    });
    expect(await statusOf(h.getUsage(reversed, ctx))).toEqual({
      status: GrpcStatus.INVALID_ARGUMENT,
      code: "invalid_time_range",
    });
    const unknown = create(GetUsageRequestSchema, { granularity: 9 as Granularity });
    expect(await statusOf(h.getUsage(unknown, ctx))).toEqual({
      status: GrpcStatus.INVALID_ARGUMENT,
      code: "invalid_granularity",
    });
  });
});

describe("RecordUsage handler", () => {
  const usage = () =>
    create(UsageRecordedSchema, {
      eventId: "evt_lost_1",
      occurredAt: timestampFromDate(now),
      requestId: "req_1",
      door: Door.ACCOUNT,
      accountId: "acct_1",
      connectionId: "conn_1",
      keyId: "key_1",
      model: "small",
      inputTokens: 5,
      outputTokens: 3,
      cost: "42",
      reservationId: "rsv_1",
    });

  it("hands a valid event to the recorder as it came", async () => {
    const recorded: UsageRecorded[] = [];
    const h = meteringHandlers(
      createMemoryUsageStore(),
      () => now,
      async (u) => {
        recorded.push(u);
      },
    );
    await h.recordUsage(create(RecordUsageRequestSchema, { usage: usage() }), ctx);
    expect(recorded.map((u) => [u.eventId, u.cost, u.outputTokens])).toEqual([["evt_lost_1", "42", 3]]);
  });

  it("refuses an event the consumer could not apply, recording nothing", async () => {
    const recorded: UsageRecorded[] = [];
    const h = meteringHandlers(
      createMemoryUsageStore(),
      () => now,
      async (u) => {
        recorded.push(u);
      },
    );
    const bad = usage();
    bad.cost = "1.5";
    expect(await statusOf(h.recordUsage(create(RecordUsageRequestSchema, { usage: bad }), ctx))).toEqual({
      status: GrpcStatus.INVALID_ARGUMENT,
      code: "invalid_usage_event",
    });
    expect(await statusOf(h.recordUsage(create(RecordUsageRequestSchema, {}), ctx))).toEqual({
      status: GrpcStatus.INVALID_ARGUMENT,
      code: "invalid_usage_event",
    });
    expect(recorded).toEqual([]);
  });
});
