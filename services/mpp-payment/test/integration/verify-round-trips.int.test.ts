import { createLogger } from "@tollgate/kit/log";
import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type RedisFixture, uniqueNamespace, useRedis } from "@tollgate/testkit/fixtures";
import { deleteMatching } from "@tollgate/testkit/redis-keys";
import { Session } from "mppx/tempo";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRedisChannelStore } from "../../src/adapters/redis-channel-store.js";
import { createCatalog } from "../../src/domain/catalog.js";
import { PaymentError } from "../../src/domain/errors.js";
import { createPayments, type Payments } from "../../src/domain/payments.js";
import type { ChannelStore } from "../../src/domain/ports.js";
import { FakeChain, PATH, paidRequest, TestPayer, testGateway, testSettings, UNIT } from "../support.js";

const { deserializeSessionReceipt } = Session.Precompile.Receipt;
const PAYEE = privateKeyToAccount(generatePrivateKey()).address;
const log = createLogger({ service: "mpp-payment", level: "silent" });

let fixture: RedisFixture;
const connections: Redis[] = [];
const namespaces: string[] = [];

beforeAll(async () => {
  fixture = await useRedis();
});

afterAll(async () => {
  const redis = connections[0];
  if (redis) {
    for (const ns of namespaces) {
      await deleteMatching(redis, `${ns}:*`);
    }
  }
  await Promise.all(connections.map((r) => quitRedis(r)));
  await fixture.stop();
});

/**
 * A replica's payments on its own Redis connection, counting the commands it sends (each one a
 * round trip: the store never pipelines on the request path).
 */
function replica(
  ns: string,
  chain: FakeChain,
): { payments: Payments; store: ChannelStore; commands: string[] } {
  const redis = connectRedis(fixture.url);
  connections.push(redis);
  const commands: string[] = [];
  const send = redis.sendCommand.bind(redis);
  redis.sendCommand = ((command: { name: string }, ...rest: unknown[]) => {
    commands.push(command.name);
    return (send as (...a: unknown[]) => unknown)(command, ...rest);
  }) as typeof redis.sendCommand;
  const store = createRedisChannelStore(redis, { prefix: `${ns}:` });
  const payments = createPayments({
    settings: testSettings(PAYEE),
    catalog: createCatalog(testGateway()),
    store,
    chain,
    log,
  });
  return { payments, store, commands };
}

/** A paid request with `payer`'s voucher for `cumulative`, answering a fresh challenge. */
async function paid(payments: Payments, payer: TestPayer, cumulative: bigint, requestId: string) {
  const req = paidRequest();
  const issued = payments.challenge(req);
  const result = await payments.verifyAndReserve(
    {
      authorization: payer.credential(issued.header, await payer.voucher(cumulative)),
      httpMethod: "POST",
      path: PATH,
      body: req.body,
    },
    requestId,
  );
  return { ...result, issued };
}

describe('Verify of a new voucher on the Redis store (docs/paid-door.md, "One round trip")', () => {
  it("accepts a new voucher and takes the hold in one Redis round trip, as it checks a reused one", async () => {
    const ns = uniqueNamespace("mpprt");
    namespaces.push(ns);
    const chain = new FakeChain();
    const { payments, store, commands } = replica(ns, chain);
    const payer = new TestPayer(PAYEE);
    await payer.openOn(payments);
    // Loads the script on the server: a first EVALSHA answered NOSCRIPT is followed by an EVAL.
    await store.offerVoucher(new TestPayer(PAYEE).channelId, {
      cumulative: 1n,
      signature: "0x00",
      checked: false,
      chainDeposit: 0n,
      chainSettled: 0n,
    });
    let spent = 0n;
    // Like the unmodified mppx client: a voucher one bucket higher on every request.
    for (let i = 2n; i <= 4n; i++) {
      commands.length = 0;
      const r = await paid(payments, payer, i * UNIT, `req_${i}`);
      expect(commands).toEqual(["evalsha"]);
      expect(r.held).toBeDefined();
      expect(deserializeSessionReceipt(r.held!.receipt)).toMatchObject({
        acceptedCumulative: String(i * UNIT),
        spent: String(spent),
      });
      await payments.commit(r.held!.reservationId, payer.channelId, r.issued.id, "1000");
      spent += 1000n;
    }
    // A reused voucher: one round trip too, and no signature to recover.
    commands.length = 0;
    const reused = await paid(payments, payer, 4n * UNIT, "req_reused");
    expect(commands).toEqual(["evalsha"]);
    await payments.release(reused.held!.reservationId, payer.channelId);
    expect(await store.get(payer.channelId)).toMatchObject({
      highest: { cumulative: 4n * UNIT },
      spent,
      held: 0n,
      units: 3,
    });
  });

  it("never holds beyond the accepted voucher when two replicas take new vouchers of one channel at once; commits add up", async () => {
    const ns = uniqueNamespace("mpprt");
    namespaces.push(ns);
    const chain = new FakeChain();
    chain.openDeposit = 50n * UNIT;
    const replicas = [replica(ns, chain), replica(ns, chain)];
    const payer = new TestPayer(PAYEE);
    const req = paidRequest();
    const quote = replicas[0]!.payments.challenge(req).quote;
    // Opened at the quote: the first voucher holds exactly one request.
    await replicas[0]!.payments.verify({
      authorization: payer.credential(replicas[0]!.payments.challenge(req).header, await payer.open(quote)),
      httpMethod: "POST",
      path: PATH,
      body: req.body,
    });
    // 24 requests at once, each with its own voucher a quarter quote higher than the one before.
    const outcomes = await Promise.allSettled(
      Array.from({ length: 24 }, (_, i) =>
        paid(replicas[i % 2]!.payments, payer, quote + (BigInt(i + 1) * quote) / 4n, `req_${i}`),
      ),
    );
    const store = replicas[0]!.store;
    const during = (await store.get(payer.channelId))!;
    const held = outcomes.flatMap((o) => (o.status === "fulfilled" && o.value.held ? [o.value] : []));
    expect(held.length).toBeGreaterThan(0);
    expect(during.held).toBe(BigInt(held.length) * quote);
    expect(during.held).toBeLessThanOrEqual(during.highest.cumulative);
    // A voucher landing after a higher one is stale; nothing else is refused.
    for (const o of outcomes) {
      if (o.status === "rejected") {
        expect(o.reason).toBeInstanceOf(PaymentError);
        expect((o.reason as PaymentError).code).toBe("mpp_payment_verification_failed");
      }
    }
    // Every receipt told stays within its accepted voucher; the commits add up to what was told.
    let told = 0n;
    for (const [i, r] of held.entries()) {
      const receipt = deserializeSessionReceipt(r.held!.receipt);
      expect(BigInt(receipt.spent) + quote).toBeLessThanOrEqual(BigInt(receipt.acceptedCumulative));
      const cost = 100n + BigInt(i);
      await replicas[i % 2]!.payments.commit(
        r.held!.reservationId,
        payer.channelId,
        r.issued.id,
        cost.toString(),
      );
      told += cost;
    }
    expect(await store.get(payer.channelId)).toMatchObject({ spent: told, held: 0n, units: held.length });
  });
});
