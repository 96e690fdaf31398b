import { RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { Action } from "@tollgate/proto/payment";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching } from "@tollgate/testkit/redis-keys";
import {
  CHANNEL_RESERVE,
  createTempoDevnet,
  DEMO_PAYEE_PRIVATE_KEY,
  DEMO_PAYER_PRIVATE_KEY,
  type TempoDevnet,
} from "@tollgate/testkit/tempo-devnet";

import { tempo as tempoClient } from "mppx/client";
import { Session } from "mppx/tempo";
import { createClient, type Hex, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { tempo } from "viem/chains";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisChannelStore } from "../../src/adapters/redis-channel-store.js";
import { type MppPayment, start } from "../../src/app.js";
import { PATH, testGateway } from "../support.js";
import { type PaymentClient, paidRoute, paymentClient } from "./paid-route.js";

const { deserializeSessionReceipt } = Session.Precompile.Receipt;
const log = createLogger({ service: "mpp-payment", level: "silent" });
const payer = privateKeyToAccount(DEMO_PAYER_PRIVATE_KEY);

let redisFixture: RedisFixture;
let redis: Redis;
let devnet: TempoDevnet;
let ns: string;
const apps: MppPayment[] = [];
const clients: PaymentClient[] = [];

beforeAll(async () => {
  [redisFixture, devnet] = await Promise.all([useRedis(), createTempoDevnet()]);
  redis = connectRedis(redisFixture.url);
  ns = uniqueNamespace("mpp");
  // Two replicas on one Redis: what one holds, the other must see.
  for (let i = 0; i < 2; i++) {
    const app = await start(
      {
        grpcHost: "127.0.0.1",
        grpcPort: 0,
        gateway: testGateway(),
        redisUrl: redisFixture.url,
        redisPrefix: `${ns}:`,
        secret: `integration-secret-${ns}-0123456789abcdef`,
        tempoRpcUrl: devnet.url,
        payeeKey: DEMO_PAYEE_PRIVATE_KEY,
        settleIntervalSeconds: 0,
        rpcPollingIntervalMs: 50,
      },
      log,
    );
    apps.push(app);
    clients.push(paymentClient(app.port));
  }
});

afterAll(async () => {
  for (const c of clients) c.$close();
  for (const app of apps) await app.stop();
  await deleteMatching(redis, `${ns}:*`);
  await quitRedis(redis);
  await Promise.all([devnet.close(), redisFixture.stop()]);
});

async function outcome<T>(
  p: Promise<T>,
): Promise<{ ok: true; value: T } | { ok: false; code: string | undefined }> {
  try {
    return { ok: true, value: await p };
  } catch (err) {
    if (err instanceof RemoteError) return { ok: false, code: err.code };
    throw err;
  }
}

describe("two mpp-payment replicas on one Redis", () => {
  it("open the same credential once, and never let parallel holds on one channel exceed the accepted voucher", async () => {
    const [a, b] = clients as [PaymentClient, PaymentClient];
    // The open credential is verified by both replicas at the same moment: one channel, one deposit.
    const route = paidRoute(a, { alsoVerifyOn: [b] });
    const session = tempoClient.session.manager({
      account: payer,
      client: createClient({
        account: payer,
        chain: tempo,
        transport: http(devnet.url),
        pollingInterval: 50,
      }),
      maxDeposit: "5",
      fetch: route.fetch,
    });
    const body = JSON.stringify({
      plan: "Starter",
      model_optimization: true,
      messages: [{ role: "user", content: "x" }],
      max_tokens: 16,
    });
    expect((await session.fetch(`http://gateway.test${PATH}`, { method: "POST", body })).status).toBe(200);
    const channelId = session.channelId as Hex;
    expect(route.log.paid.map((p) => p.action)).toEqual([Action.OPEN]);
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(5_000_000n);

    const store = createRedisChannelStore(redis, { prefix: `${ns}:` });
    const before = (await store.get(channelId))!;
    const quote = 45_000n;
    const fits = (before.highest.cumulative - before.spent - before.held) / quote;
    const attempts = 2 * Number(fits) + 7;
    const paid = route.log.paid[0]!;
    const verified = await b.verify({
      authorization: paid.authorization,
      httpMethod: "POST",
      path: PATH,
      body: paid.body,
    });

    // Every attempt reserves on one replica and commits on the other, all at once.
    const results = await Promise.all(
      Array.from({ length: attempts }, async (_, i) => {
        const [reserveOn, commitOn] = i % 2 === 0 ? [a, b] : [b, a];
        const held = await outcome(
          reserveOn.reserve({ channelId, requestId: `burst-${i}`, quote: String(quote) }),
        );
        if (!held.ok) return held;
        const committed = await commitOn.commit({
          reservationId: held.value.reservationId,
          channelId,
          challengeId: verified.challengeId,
          actualCost: String(quote),
        });
        return { ok: true as const, value: deserializeSessionReceipt(committed.paymentReceipt) };
      }),
    );
    const served = results.filter((r) => r.ok);
    const refused = results.filter((r) => !r.ok);
    expect(served).toHaveLength(Number(fits));
    expect(new Set(refused.map((r) => (r.ok ? "" : r.code)))).toEqual(
      new Set(["mpp_voucher_bucket_refresh_required"]),
    );

    const after = (await store.get(channelId))!;
    expect(after.spent).toBe(before.spent + fits * quote);
    expect(after.spent).toBeLessThanOrEqual(after.highest.cumulative);
    expect(after).toMatchObject({ held: 0n, units: before.units + Number(fits) });
    // Each receipt reports a distinct point of one linear history.
    const spents = served.map((r) => (r.ok && "spent" in r.value ? BigInt(r.value.spent) : -1n));
    expect(new Set(spents).size).toBe(spents.length);
    expect(spents.every((s) => s <= before.highest.cumulative)).toBe(true);
    expect(spents.reduce((m, s) => (s > m ? s : m), 0n)).toBe(after.spent);

    // The same voucher verified on both replicas in parallel is accepted by both, unchanged.
    const again = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        (i % 2 === 0 ? a : b).verify({
          authorization: paid.authorization,
          httpMethod: "POST",
          path: PATH,
          body: paid.body,
        }),
      ),
    );
    expect(new Set(again.map((v) => v.acceptedCumulative))).toEqual(
      new Set([String(before.highest.cumulative)]),
    );
    await session.close();
    expect(devnet.channel(channelId)).toMatchObject({ finalized: true, settled: after.spent });
  });
});
