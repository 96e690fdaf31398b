import { RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { Action } from "@tollgate/proto/payment";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching } from "@tollgate/testkit/redis-keys";
import {
  CHANNEL_RESERVE,
  createTempoDevnet,
  DEMO_PAYEE_ADDRESS,
  DEMO_PAYEE_PRIVATE_KEY,
  DEMO_PAYER_PRIVATE_KEY,
  type TempoDevnet,
} from "@tollgate/testkit/tempo-devnet";

import { tempo as tempoClient } from "mppx/client";
import { Session } from "mppx/tempo";
import { type Account, createClient, type Hex, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { tempo } from "viem/chains";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisChannelStore } from "../../src/adapters/redis-channel-store.js";
import { type MppPayment, type MppPaymentOptions, start } from "../../src/app.js";
import type { ChannelStore } from "../../src/domain/ports.js";
import { PATH, testGateway, UNIT } from "../support.js";
import { type PaymentClient, paidRoute, paymentClient } from "./paid-route.js";

const { deserializeSessionReceipt } = Session.Precompile.Receipt;
const log = createLogger({ service: "mpp-payment", level: "silent" });
const URL_ = `http://gateway.test${PATH}`;
const payer = privateKeyToAccount(DEMO_PAYER_PRIVATE_KEY);

let redisFixture: RedisFixture;
let redis: Redis;
let devnet: TempoDevnet;
const namespaces: string[] = [];
const running: Array<{ stop(): Promise<void> } | { $close(): void }> = [];

beforeAll(async () => {
  [redisFixture, devnet] = await Promise.all([useRedis(), createTempoDevnet()]);
  redis = connectRedis(redisFixture.url);
});

afterAll(async () => {
  for (const r of running.reverse()) await ("stop" in r ? r.stop() : r.$close());
  // Remove only what this run created; the server may be shared.
  for (const ns of namespaces) {
    await deleteMatching(redis, `${ns}:*`);
  }
  await quitRedis(redis);
  await Promise.all([devnet.close(), redisFixture.stop()]);
});

/** A replica on this run's Redis namespace and the devnet, with a client on it. */
async function startReplica(
  ns: string,
  overrides: Partial<MppPaymentOptions> = {},
): Promise<{ app: MppPayment; client: PaymentClient; store: ChannelStore }> {
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
      ...overrides,
    },
    log,
  );
  const client = paymentClient(app.port);
  running.push(app, client);
  return { app, client, store: createRedisChannelStore(redis, { prefix: `${ns}:` }) };
}

function namespace(): string {
  const ns = uniqueNamespace("mpp");
  namespaces.push(ns);
  return ns;
}

/** The unmodified mppx session manager, paying through the stand-in paid route. */
function manager(route: ReturnType<typeof paidRoute>, account: Account = payer) {
  return tempoClient.session.manager({
    account,
    client: createClient({ account, chain: tempo, transport: http(devnet.url), pollingInterval: 50 }),
    maxDeposit: "5",
    fetch: route.fetch,
  });
}

function chatBody(content: string): string {
  return JSON.stringify({
    plan: "Starter",
    model_optimization: true,
    messages: [{ role: "user", content }],
    max_tokens: 64,
    stream: false,
  });
}

async function codeOf(p: Promise<unknown>): Promise<string | undefined> {
  try {
    await p;
  } catch (err) {
    if (err instanceof RemoteError) return err.code;
    throw err;
  }
  throw new Error("expected a refusal");
}

describe("mpp-payment against the Tempo devnet, real Redis and the unmodified mppx client", () => {
  it("opens, serves paid requests with receipts, reuses a voucher, refuses what does not fit, tops up, settles and closes to the exact balances", async () => {
    const ns = namespace();
    const { app, client, store } = await startReplica(ns);
    const route = paidRoute(client);
    const session = manager(route);
    const payerBefore = devnet.balanceOf(payer.address);
    const payeeBefore = devnet.balanceOf(DEMO_PAYEE_ADDRESS);

    // Open (a real signed 0x76 transaction, broadcast by the service), then two vouchers.
    let spent = 0n;
    for (let i = 1; i <= 3; i++) {
      const response = await session.fetch(URL_, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: chatBody(`request ${i}`),
      });
      expect(response.status).toBe(200);
      const header = response.headers.get("payment-receipt");
      expect(header).toBeTruthy();
      const receipt = deserializeSessionReceipt(header!);
      expect(BigInt(receipt.spent)).toBeGreaterThan(spent);
      spent = BigInt(receipt.spent);
      expect(receipt).toMatchObject({
        method: "tempo",
        intent: "session",
        status: "success",
        channelId: session.channelId,
        reference: session.channelId,
        acceptedCumulative: String(BigInt(i) * UNIT),
        units: i,
      });
    }
    expect(route.log.paid.map((p) => p.action)).toEqual([Action.OPEN, Action.VOUCHER, Action.VOUCHER]);
    const channelId = session.channelId as Hex;
    expect(channelId).toMatch(/^0x[0-9a-f]{64}$/);
    expect(devnet.channel(channelId)).toMatchObject({ deposit: 5n * UNIT, settled: 0n, finalized: false });

    // docs/contract.md, "Payment sessions", rule 4: the same cumulative voucher is accepted again
    // for the next request.
    const last = route.log.paid.at(-1)!;
    const reused = await client.verify({
      authorization: last.authorization,
      httpMethod: "POST",
      path: PATH,
      body: last.body,
    });
    expect(reused).toMatchObject({
      action: Action.VOUCHER,
      channelId,
      acceptedCumulative: String(3n * UNIT),
      // Not asked to reserve: a separate Reserve holds the quote.
      reservationId: "",
    });
    const { reservationId } = await client.reserve({ channelId, requestId: "reuse-1", quote: reused.quote });
    const reuseReceipt = deserializeSessionReceipt(
      (await client.commit({ reservationId, channelId, challengeId: reused.challengeId, actualCost: "777" }))
        .paymentReceipt,
    );
    spent += 777n;
    expect(reuseReceipt).toMatchObject({
      spent: String(spent),
      acceptedCumulative: String(3n * UNIT),
      units: 4,
    });

    // Holds of a whole bucket fit twice into 3 units minus the spend; the third needs a refresh.
    const holds: string[] = [];
    for (let i = 0; i < 2; i++) {
      holds.push(
        (await client.reserve({ channelId, requestId: `big-${i}`, quote: String(UNIT) })).reservationId,
      );
    }
    expect(await codeOf(client.reserve({ channelId, requestId: "big-2", quote: String(UNIT) }))).toBe(
      "mpp_voucher_bucket_refresh_required",
    );
    expect(await codeOf(client.reserve({ channelId, requestId: "huge", quote: String(UNIT + 1n) }))).toBe(
      "mpp_request_exceeds_voucher_bucket",
    );
    // One whole bucket is served; the other hold goes back.
    await client.commit({
      reservationId: holds[0]!,
      channelId,
      challengeId: reused.challengeId,
      actualCost: String(UNIT),
    });
    spent += UNIT;
    await client.release({ reservationId: holds[1]!, channelId });
    expect(await store.get(channelId)).toMatchObject({ spent, held: 0n, units: 5 });

    // The settlement worker settles with the largest voucher within the spend: the 1-unit one.
    await app.settleOnce();
    expect(devnet.channel(channelId)?.settled).toBe(UNIT);
    expect((await store.get(channelId))?.settled).toBe(UNIT);

    // A top-up through the manager: a bodyless management request answered 204 + receipt.
    await session.topUp("1");
    expect(route.log.paid.at(-1)?.action).toBe(Action.TOP_UP);
    expect(devnet.channel(channelId)?.deposit).toBe(6n * UNIT);
    expect((await store.get(channelId))?.deposit).toBe(6n * UNIT);

    // Close: the payee gets exactly the committed spend, the payer the rest of the deposit.
    const closed = await session.close();
    expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect(closed).toMatchObject({ acceptedCumulative: String(3n * UNIT), spent: String(spent), channelId });
    expect(devnet.channel(channelId)).toMatchObject({ finalized: true, settled: spent });
    expect(devnet.balanceOf(DEMO_PAYEE_ADDRESS) - payeeBefore).toBe(spent);
    expect(payerBefore - devnet.balanceOf(payer.address)).toBe(spent);
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(0n);
    expect(await store.get(channelId)).toMatchObject({ status: "closed", settled: spent });
    expect(await codeOf(client.reserve({ channelId, requestId: "after-close", quote: "1" }))).toBe(
      "mpp_reservation_failed",
    );
  });

  it("on a failed inference, Verify-and-Reserve then Release leaves no receipt and the hold released", async () => {
    const ns = namespace();
    const { client, store } = await startReplica(ns);
    const route = paidRoute(client);
    const session = manager(route);
    expect((await session.fetch(URL_, { method: "POST", body: chatBody("open") })).status).toBe(200);
    const channelId = session.channelId as Hex;
    const before = await store.get(channelId);
    const paid = route.log.paid.at(-1)!;
    // api-edge's one call: verify the credential and hold the quote.
    const v = await client.verify({
      authorization: paid.authorization,
      httpMethod: "POST",
      path: PATH,
      body: paid.body,
      reserveRequestId: "req-failed",
    });
    const { reservationId } = v;
    expect(reservationId).not.toBe("");
    expect((await store.get(channelId))?.held).toBe(BigInt(v.quote));
    // Inference failed: api-edge releases instead of committing.
    await client.release({ reservationId, channelId });
    expect(await store.get(channelId)).toEqual(before);
    expect(
      await codeOf(client.commit({ reservationId, channelId, challengeId: v.challengeId, actualCost: "1" })),
    ).toBe("mpp_commit_failed");
    expect(await store.get(channelId)).toEqual(before);
    await session.close();
  });

  it("refuses a changed body, a malformed credential and a close it cannot sign, over gRPC with the spec's codes", async () => {
    const ns = namespace();
    const { client } = await startReplica(ns, { payeeKey: undefined, recipient: DEMO_PAYEE_ADDRESS });
    const route = paidRoute(client);
    const session = manager(route);
    expect((await session.fetch(URL_, { method: "POST", body: chatBody("hello") })).status).toBe(200);
    const paid = route.log.paid.at(-1)!;
    const tampered = Buffer.from(chatBody("hellO"));
    expect(
      await codeOf(
        client.verify({ authorization: paid.authorization, httpMethod: "POST", path: PATH, body: tampered }),
      ),
    ).toBe("mpp_body_digest_mismatch");
    expect(
      await codeOf(
        client.verify({ authorization: "Payment %%%", httpMethod: "POST", path: PATH, body: tampered }),
      ),
    ).toBe("mpp_malformed_credential");
    // Without the payee key the close cannot run; the channel stays open on chain.
    await expect(session.close()).rejects.toThrow();
    expect(route.log.codes).toContain("mpp_session_close_unavailable");
    expect(devnet.channel(session.channelId as Hex)).toMatchObject({ finalized: false, deposit: 5n * UNIT });
  });
});
