import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisLedger } from "../../src/adapters/redis-ledger.js";
import { newReservationId, settleReservations } from "../../src/domain/budget.js";
import { settleBatchContract } from "../settle-batch-contract.js";

let fixture: RedisFixture;
let redis: Redis;
const prefixes: string[] = [];

function prefix(): string {
  const p = `${uniqueNamespace("auth")}:`;
  prefixes.push(p);
  return p;
}

beforeAll(async () => {
  fixture = await useRedis();
  redis = connectRedis(fixture.url);
});

afterAll(async () => {
  for (const p of prefixes) {
    const keys: string[] = [];
    for await (const batch of redis.scanStream({ match: `${p}*`, count: 500 }))
      keys.push(...(batch as string[]));
    if (keys.length > 0) await redis.del(...keys);
  }
  await quitRedis(redis);
  await fixture.stop();
});

describe("redis ledger: batch settlement", () => {
  settleBatchContract((opts) => createRedisLedger(redis, { ...opts, prefix: prefix(), clock: "caller" }));

  it("reads every record in one pipeline and settles in another, and one item's failure leaves the others settled", async () => {
    const p = prefix();
    const ledger = createRedisLedger(redis, { prefix: p });
    expect(ledger.settleMany).toBeTypeOf("function");
    const now = new Date();
    const b = {
      id: "{acct}:connection:c:month:x",
      scope: "connection" as const,
      limit: 1_000n,
      periodEndMs: now.getTime() + 86_400_000,
    };
    const ids = [newReservationId("acct"), newReservationId("acct")];
    for (const reservationId of ids) {
      await ledger.admit([], { hold: { reservationId, amount: 100n, budgets: [b] } }, now);
    }
    // A record Redis cannot read as a hash: its item fails, alone.
    const broken = newReservationId("acct");
    await redis.set(`${p}auth:reservation:${broken}`, "not a hash");
    const sent: string[] = [];
    const monitor = await redis.monitor();
    monitor.on("monitor", (_time: string, args: string[], source: string) => {
      // Commands a script runs are shown too; only what the ledger sends counts.
      if (!source.includes("lua")) sent.push(String(args[0]).toLowerCase());
    });
    const results = await settleReservations(ledger, [
      { reservationId: ids[0]!, cost: 40n, eventId: "e0" },
      { reservationId: broken, cost: 1n, eventId: "eb" },
      { reservationId: ids[1]!, cost: 60n, eventId: "e1" },
    ]);
    await new Promise((r) => setTimeout(r, 100));
    monitor.disconnect();
    expect(results[0]).toEqual({ outcome: "settled", cost: 40n });
    expect(results[1]).toBeInstanceOf(Error);
    expect(results[2]).toEqual({ outcome: "settled", cost: 60n });
    // Three reads, then two settlement scripts (the broken record is not settled).
    expect(sent.filter((c) => c === "hget")).toHaveLength(3);
    expect(sent.filter((c) => c === "evalsha" || c === "eval")).toHaveLength(2);
    const peek = await ledger.admit([], { peek: [b] }, now);
    expect(peek.budgets[0]).toEqual({ spent: 100n, held: 0n });
  });
});
