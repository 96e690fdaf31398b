import { PaidSession } from "@tollgate/agent-client";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { type RedisFixture, uniqueNamespace, useNats, useRedis } from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { Redis } from "ioredis";
import { Challenge, Credential } from "mppx";
import { Session } from "mppx/tempo";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  fund,
  PAID_PATH,
  PAID_PROMPT_MARKER,
  planDefault,
  servedCost,
  type WireEntry,
  wireRecorder,
} from "./paid-door-kit.js";

/**
 * One challenge pays for one request (docs/paid-door.md, "One challenge, one request"), on the
 * multi-process stack (real Redis, where mpp-payment keeps the channel's spend and holds): a
 * captured `Authorization: Payment` credential sent again with its body, once or many times at
 * once, is refused 402 mpp_invalid_challenge with a fresh challenge, runs no model and charges
 * nothing; of one unused credential sent several times at once exactly one is served. After
 * each: what the payer was told (x-tollgate-cost, receipts) == the committed spend, no hold left.
 */

const FUNDING = 50_000_000n;

let stack: Stack;
let redis: RedisFixture;
let nats: Awaited<ReturnType<typeof useNats>>;
let upstream: FakeUpstream;
let db: Redis;
let prefix: string;

beforeAll(async () => {
  const namespace = uniqueNamespace("paidreplay");
  prefix = `tollgate:${namespace}:mpp:`;
  [redis, nats, upstream] = await Promise.all([useRedis(), useNats(), startFakeUpstream({ record: true })]);
  stack = await startStack({
    natsUrl: nats.url,
    redisUrl: redis.url,
    namespace,
    routers: 1,
    upstreamPort: upstream.port,
    externalUpstream: true,
    // No settlement pass moves money while a test reads the books.
    paymentEnv: { MPP_SETTLE_INTERVAL_SECONDS: "0" },
  });
  db = new Redis(redis.url);
}, 60_000);

afterAll(async () => {
  db?.disconnect();
  await stack?.stop();
  await upstream?.close();
  await Promise.all([redis?.stop(), nats?.stop()]);
});

const chatBody = (content: string) => ({
  plan: "Starter" as const,
  model_optimization: true,
  max_tokens: 8,
  messages: [{ role: "user", content: `${PAID_PROMPT_MARKER} ${content}` }],
});

/** Completions the upstream received: one per model run. */
const modelRuns = () =>
  upstream.requests.filter((r) => r.method === "POST" && r.path === "/v1/chat/completions").length;

/** The channel as mpp-payment's Redis store holds it, once no hold is live (5 s at most). */
async function books(channelId: string) {
  const key = `${prefix}ch:{${channelId.toLowerCase()}}`;
  const deadline = Date.now() + 5_000;
  for (;;) {
    const [ch, holds] = await Promise.all([db.hgetall(key), db.hlen(`${key}:holds`)]);
    const state = {
      spent: BigInt(ch["spent"] ?? "-1"),
      held: BigInt(ch["held"] ?? "-1"),
      units: Number(ch["units"] ?? "-1"),
      liveHolds: holds,
    };
    if ((state.held === 0n && holds === 0) || Date.now() > deadline) return state;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A funded payer on our agent client, recording the wire and every cost it was told. */
async function newSession() {
  const key = generatePrivateKey();
  await fund(stack.tempoRpcUrl, privateKeyToAccount(key).address, FUNDING);
  const wire = wireRecorder();
  const told: bigint[] = [];
  const session = new PaidSession({
    url: stack.url,
    privateKey: key,
    rpcUrl: stack.tempoRpcUrl,
    maxDeposit: 20_000_000n,
    fetch: (async (input: string | URL | Request, init?: RequestInit) => {
      const res = await wire.fetch(input, init);
      const cost = res.headers.get("x-tollgate-cost");
      if (res.status === 200 && cost !== null) told.push(BigInt(cost));
      return res;
    }) as typeof fetch,
  });
  return { session, wire, told };
}

/** Sends `authorization` with `body` as a raw POST, the way anyone holding a copy could. */
async function send(authorization: string, body: string) {
  const res = await fetch(`${stack.url}${PAID_PATH}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization },
    body,
  });
  const text = await res.text();
  return {
    status: res.status,
    code: res.status >= 400 ? (JSON.parse(text) as { code?: string }).code : undefined,
    wwwAuthenticate: res.headers.get("www-authenticate"),
    receipt: res.headers.get("payment-receipt"),
    cost: res.headers.get("x-tollgate-cost"),
  };
}

const challengeIdOf = (authorization: string) => Credential.deserialize(authorization).challenge.id;

/** The last paid request our client sent and was served. */
const lastPaid = (entries: readonly WireEntry[]) =>
  entries.filter((e) => e.authorization !== undefined && e.status === 200).at(-1)!;

describe("paid door: a replayed payment credential (multi-process stack)", () => {
  it("two paid chats, then the last credential resent 3 times at once: all refused 402 mpp_invalid_challenge with a fresh challenge, nothing run or charged; the next chat and the close pay only the payer's own requests", async () => {
    const { session, wire, told } = await newSession();
    const bodies = [chatBody("replay 1"), chatBody("replay 2")];
    for (const body of bodies) expect((await session.chat(body)).status).toBe(200);
    const channelId = session.channelId!;
    const cost = servedCost(bodies[0]!, planDefault("Starter"));
    expect(told).toEqual([cost, servedCost(bodies[1]!, planDefault("Starter"))]);

    const captured = lastPaid(wire.entries);
    const runs = modelRuns();
    const replays = await Promise.all([1, 2, 3].map(() => send(captured.authorization!, captured.body)));
    for (const r of replays) {
      expect(r).toMatchObject({ status: 402, code: "mpp_invalid_challenge", receipt: null, cost: null });
      // A fresh challenge, as every retryable 402 of the paid door carries.
      const fresh = Challenge.deserialize(r.wwwAuthenticate!);
      expect(fresh.id).not.toBe(challengeIdOf(captured.authorization!));
    }
    expect(modelRuns()).toBe(runs);
    const sum = (xs: bigint[]) => xs.reduce((a, b) => a + b, 0n);
    expect(await books(channelId)).toEqual({ spent: sum(told), held: 0n, units: 2, liveHolds: 0 });

    // The payer's next request: its receipt counts only the payer's own spend.
    const next = chatBody("replay 3");
    const res = await session.chat(next);
    expect(res.status).toBe(200);
    expect(told).toHaveLength(3);
    expect(BigInt(res.receipt.spent)).toBe(sum(told));
    expect(res.receipt.units).toBe(3);
    expect(await books(channelId)).toEqual({ spent: sum(told), held: 0n, units: 3, liveHolds: 0 });

    // The close (bodyless, on the last challenge) settles exactly what the payer was told.
    const closed = await session.close();
    expect(closed?.spent).toBe(sum(told));
  });

  it("an unused credential sent 3 times at once is served exactly once", async () => {
    const { session, wire, told } = await newSession();
    expect((await session.chat(chatBody("concurrent 1"))).status).toBe(200);
    const channelId = session.channelId!;
    // A new request of the payer's, signed (its accepted voucher, reused: docs/contract.md,
    // "Payment sessions", rule 4) but not yet sent, captured and raced by copies of itself.
    const accepted = Credential.deserialize(lastPaid(wire.entries).authorization!);
    const body = JSON.stringify(chatBody("concurrent 2"));
    const unpaid = await fetch(`${stack.url}${PAID_PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
    });
    expect(unpaid.status).toBe(402);
    await unpaid.body?.cancel();
    const authorization = Credential.serialize(
      Credential.from({
        challenge: Challenge.fromResponse(unpaid),
        payload: accepted.payload,
        ...(accepted.source ? { source: accepted.source } : {}),
      }),
    );
    const runs = modelRuns();
    const answers = await Promise.all([1, 2, 3].map(() => send(authorization, body)));
    const served = answers.filter((a) => a.status === 200);
    expect(served).toHaveLength(1);
    expect(answers.filter((a) => a.status === 402 && a.code === "mpp_invalid_challenge")).toHaveLength(2);
    expect(modelRuns() - runs).toBe(1);
    const receipt = Session.Precompile.Receipt.deserializeSessionReceipt(served[0]!.receipt!);
    const all = [...told, BigInt(served[0]!.cost!)];
    const sum = all.reduce((a, b) => a + b, 0n);
    expect(BigInt(receipt.spent)).toBe(sum);
    expect(await books(channelId)).toEqual({ spent: sum, held: 0n, units: 2, liveHolds: 0 });
    // The payer's own client still pays and closes on the channel.
    const next = await session.chat(chatBody("concurrent 3"));
    expect(BigInt(next.receipt.spent)).toBe(told.reduce((a, b) => a + b, 0n) + BigInt(served[0]!.cost!));
    const closed = await session.close();
    expect(closed?.spent).toBe(BigInt(next.receipt.spent));
  });
});
