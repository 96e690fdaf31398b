import { randomBytes, randomUUID } from "node:crypto";
import { PaidSession, PaidSessionError } from "@tollgate/agent-client";
import { createClient } from "@tollgate/kit/grpc";
import { Door, InferenceService, Operation } from "@tollgate/proto/inference";
import { MeteringService } from "@tollgate/proto/metering";
import { PaymentService } from "@tollgate/proto/payment";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { type RedisFixture, uniqueNamespace, useNats, useRedis } from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { DEMO_PAYEE_ADDRESS } from "@tollgate/testkit/tempo-devnet";
import { Redis } from "ioredis";
import { Challenge, Credential } from "mppx";
import { tempo as tempoClient } from "mppx/client";
import { Session } from "mppx/tempo";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  balanceOf,
  fund,
  PAID_PATH,
  PAID_PROMPT_MARKER,
  payerClient,
  planDefault,
  quoteFor,
  servedCost,
  type WireEntry,
  wireRecorder,
  wireSecrets,
} from "./paid-door-kit.js";

type SessionReceipt = ReturnType<typeof Session.Precompile.Receipt.deserializeSessionReceipt>;
type Plan = "Starter" | "Plus" | "Premium";

/**
 * The paid door's money, driven by the unmodified mppx client on the multi-process stack (real
 * Redis, so the channel's committed spend and holds are read where mpp-payment keeps them):
 * - a hold, a commit and a receipt belong to one HTTP request, whatever `X-Request-Id` callers
 *   send: parallel requests sharing one, parallel requests naming none, and one id reused
 *   request after request all pay exactly their own cost;
 * - a first paid request whose model fails after the open was broadcast leaves the payer with
 *   its channel: the same client pays on it, opens nothing else, and closes to the exact balances.
 * - api-edge gone between its answer and its Commit: metering commits the hold from the
 *   router's usage event, once, at the event's cost, and the close pays it.
 * After each: what callers were told (x-tollgate-cost) == the channel's committed spend, one
 * commit per answer, every receipt within it, and no hold is left. A paid answer goes out before
 * its Commit lands (docs/paid-door.md, "One round trip"): the books are read once the holds have
 * settled, and a close sent right after an answer pays it too. Every answer is committed twice
 * over, by api-edge and by metering from its usage event: the books show it charged once.
 */

const FUNDING = 50_000_000n;
/** Parallel requests per batch. */
const N = 5;

let stack: Stack;
let redis: RedisFixture;
let nats: Awaited<ReturnType<typeof useNats>>;
let upstream: FakeUpstream;
let db: Redis;
let prefix: string;
const lines: string[] = [];
const wires: WireEntry[][] = [];

beforeAll(async () => {
  const namespace = uniqueNamespace("paidmoney");
  prefix = `tollgate:${namespace}:mpp:`;
  [redis, nats, upstream] = await Promise.all([useRedis(), useNats(), startFakeUpstream({ record: true })]);
  stack = await startStack({
    natsUrl: nats.url,
    redisUrl: redis.url,
    namespace,
    routers: 1,
    upstreamPort: upstream.port,
    externalUpstream: true,
    // No settlement pass moves money while a test reads balances.
    paymentEnv: { MPP_SETTLE_INTERVAL_SECONDS: "0" },
    onLine: (service, line) => {
      if (service !== "tempo-devnet") lines.push(`${service}: ${line}`);
    },
  });
  db = new Redis(redis.url);
}, 60_000);

afterAll(async () => {
  db?.disconnect();
  await stack?.stop();
  await upstream?.close();
  await Promise.all([redis?.stop(), nats?.stop()]);
});

const chatBody = (content: string, plan: Plan = "Starter") => ({
  plan,
  model_optimization: true,
  max_tokens: 8,
  messages: [{ role: "user", content: `${PAID_PROMPT_MARKER} ${content}` }],
});

/** Completions the upstream received: one per model run. */
const modelRuns = () =>
  upstream.requests.filter((r) => r.method === "POST" && r.path === "/v1/chat/completions").length;

/** The channel as mpp-payment's Redis store holds it. */
async function channelState(channelId: string) {
  const key = `${prefix}ch:{${channelId.toLowerCase()}}`;
  const [ch, holds, expiries] = await Promise.all([
    db.hgetall(key),
    db.hlen(`${key}:holds`),
    db.zcard(`${key}:exp`),
  ]);
  return {
    spent: BigInt(ch["spent"] ?? "-1"),
    held: BigInt(ch["held"] ?? "-1"),
    deposit: BigInt(ch["deposit"] ?? "-1"),
    units: Number(ch["units"] ?? "-1"),
    status: ch["status"],
    liveHolds: holds + expiries,
  };
}

/** The channel once no hold is live: the Commits api-edge sent after its answers have landed (bounded). */
async function settledState(channelId: string) {
  const deadline = Date.now() + 5_000;
  for (;;) {
    const state = await channelState(channelId);
    if ((state.held === 0n && state.liveHolds === 0) || Date.now() > deadline) return state;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Metering's totals of every door (the usage events of this file's tests), once it has applied
 * every published event and counts at least `requests` (10 s at most).
 */
async function metered(requests = 0n): Promise<{ requests: bigint; cost: bigint }> {
  const port = stack.processes.find((x) => x.name === "metering")!.port;
  const metering = createClient(MeteringService, `127.0.0.1:${port}`, stack.internalAuth("api-edge"));
  const lag = async () => {
    const text = await (await fetch(stack.metricsUrls["metering"]!)).text();
    return Number(/^tollgate_consumer_lag_messages (\d+)$/m.exec(text)?.[1] ?? "-1");
  };
  try {
    const deadline = Date.now() + 10_000;
    for (;;) {
      // The lag first: once it reads 0, every event published before is applied, so totals read
      // after it count them (read before it, they could miss events applied in between).
      const caughtUp = (await lag()) === 0;
      const totals = (await metering.getUsage({})).totals;
      const now = { requests: totals?.requests ?? 0n, cost: BigInt(totals?.cost || "0") };
      if ((caughtUp && now.requests >= requests) || Date.now() > deadline) return now;
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    metering.$close();
  }
}

/** A fresh funded payer with an unmodified mppx session manager. */
async function newPayer() {
  const payer = privateKeyToAccount(generatePrivateKey());
  await fund(stack.tempoRpcUrl, payer.address, FUNDING);
  const wire = wireRecorder();
  wires.push(wire.entries);
  const manager = tempoClient.session.manager({
    account: payer,
    client: payerClient(stack.tempoRpcUrl, payer),
    maxDeposit: "20",
    fetch: wire.fetch,
  });
  const pay = (body: ReturnType<typeof chatBody>, headers: Record<string, string> = {}) =>
    manager.fetch(`${stack.url}${PAID_PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });
  return { payer, manager, wire, pay };
}

/** The session action of a credential the wire carried. */
function actionOf(e: WireEntry): string | undefined {
  if (!e.authorization) return undefined;
  return (Credential.deserialize(e.authorization).payload as { action?: string }).action;
}

/** A paid answer as its caller saw it. */
interface Served {
  cost: bigint;
  receipt: SessionReceipt;
}

/** Checks a 200 and returns what it told the caller: the cost it names and its receipt. */
async function served(res: Response, body: ReturnType<typeof chatBody>): Promise<Served> {
  expect(res.status).toBe(200);
  await res.text();
  const header = res.headers.get("payment-receipt");
  expect(header, "a 200 without Payment-Receipt").toBeTruthy();
  const cost = BigInt(res.headers.get("x-tollgate-cost") ?? "-1");
  // The commit records exactly the served usage at the plan model's price.
  expect(cost).toBe(servedCost(body, planDefault(body.plan)));
  return { cost, receipt: Session.Precompile.Receipt.deserializeSessionReceipt(header!) };
}

/**
 * The books of a channel once its holds have settled: what callers were told (x-tollgate-cost)
 * adds up to the committed spend, one committed request per answer, no hold left; and every
 * receipt is true and valid: its spent covers its own cost and is never above the committed
 * spend nor its accepted cumulative (a receipt is the spend read with its hold plus its cost;
 * two requests held at once both count from the same spend).
 */
async function expectMoneyAddsUp(channelId: string, answers: readonly Served[]) {
  const told = answers.reduce((sum, a) => sum + a.cost, 0n);
  expect(told).toBeGreaterThan(0n);
  const state = await settledState(channelId);
  expect({ spent: state.spent, units: state.units, held: state.held, liveHolds: state.liveHolds }).toEqual({
    spent: told,
    units: answers.length,
    held: 0n,
    liveHolds: 0,
  });
  for (const a of answers) {
    expect(a.receipt.channelId).toBe(channelId);
    const spent = BigInt(a.receipt.spent);
    expect(spent).toBeGreaterThanOrEqual(a.cost);
    expect(spent).toBeLessThanOrEqual(told);
    expect(spent).toBeLessThanOrEqual(BigInt(a.receipt.acceptedCumulative));
  }
  return told;
}

/** Close through the gateway: the payee gets exactly `spent`, the payer every other base unit back. */
async function closeToExactBalances(
  p: Awaited<ReturnType<typeof newPayer>>,
  spent: bigint,
  payeeBefore: bigint,
) {
  const closed = await p.manager.close();
  expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
  expect(BigInt(closed!.spent)).toBe(spent);
  expect((await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(spent);
  expect(await balanceOf(stack.tempoRpcUrl, p.payer.address)).toBe(FUNDING - spent);
}

/** A funded payer on our agent client, recording the wire and every cost it was told. */
async function newSession() {
  const key = generatePrivateKey();
  await fund(stack.tempoRpcUrl, privateKeyToAccount(key).address, FUNDING);
  const wire = wireRecorder();
  wires.push(wire.entries);
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

describe("paid door money on the multi-process stack, with the unmodified mppx client", () => {
  it("parallel paid requests sharing one X-Request-Id, or naming none, each take their own hold, commit and receipt; one id reused request after request pays each time", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer();
    const answers: Served[] = [];

    // The session: an open, then a voucher one bucket higher (mppx signs one more per request).
    for (const i of [1, 2]) {
      const body = chatBody(`session ${i}`);
      answers.push(await served(await p.pay(body), body));
    }
    const channelId = p.manager.channelId!;
    expect(p.wire.entries.filter((e) => e.body.length > 0).map(actionOf)).toEqual([
      undefined,
      "open",
      undefined,
      "voucher",
    ]);
    // mppx's session manager is single-flight, so parallel requests reuse its accepted voucher
    // (docs/contract.md, "Payment sessions", rule 4), each wrapped by mppx's own Credential around
    // a fresh challenge of its own body: what a client sending several requests on one session
    // sends.
    const accepted = Credential.deserialize(
      p.wire.entries.filter((e) => actionOf(e) === "voucher").at(-1)!.authorization!,
    );

    const parallel = async (label: string, headers: Record<string, string>) => {
      // Plans alternate, so requests of different prices run side by side.
      const bodies = Array.from({ length: N }, (_, i) =>
        chatBody(`${label} ${i}`, i % 2 === 0 ? "Starter" : "Premium"),
      );
      const credentials = await Promise.all(
        bodies.map(async (body) => {
          const unpaid = await p.wire.fetch(`${stack.url}${PAID_PATH}`, {
            method: "POST",
            headers: { "content-type": "application/json", ...headers },
            body: JSON.stringify(body),
          });
          expect(unpaid.status).toBe(402);
          await unpaid.body?.cancel();
          return Credential.serialize(
            Credential.from({
              challenge: Challenge.fromResponse(unpaid),
              payload: accepted.payload,
              ...(accepted.source ? { source: accepted.source } : {}),
            }),
          );
        }),
      );
      const runs = modelRuns();
      const responses = await Promise.all(
        bodies.map((body, i) =>
          p.wire.fetch(`${stack.url}${PAID_PATH}`, {
            method: "POST",
            headers: { "content-type": "application/json", authorization: credentials[i]!, ...headers },
            body: JSON.stringify(body),
          }),
        ),
      );
      for (const [i, res] of responses.entries()) answers.push(await served(res, bodies[i]!));
      expect(modelRuns() - runs).toBe(N);
    };

    await parallel("shared id", { "x-request-id": `shared-${randomBytes(4).toString("hex")}` });
    await parallel("no id", {});

    // One X-Request-Id on request after request, as a caller retrying keeps it: each is paid.
    const reused = `reused-${randomBytes(4).toString("hex")}`;
    for (const i of [1, 2, 3]) {
      const body = chatBody(`reused id ${i}`, i === 2 ? "Premium" : "Starter");
      const res = await p.pay(body, { "x-request-id": reused });
      expect(res.headers.get("x-request-id")).toBe(reused);
      answers.push(await served(res, body));
    }

    expect(answers).toHaveLength(2 + 2 * N + 3);
    const spent = await expectMoneyAddsUp(channelId, answers);
    await closeToExactBalances(p, spent, payeeBefore);
  });

  it("n choices are priced into the paid quote: the receipt pays every choice, within the hold", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer();
    const answers: Served[] = [];
    for (const n of [1, 4]) {
      const body = { ...chatBody(`fan-out ${n}`), n };
      const res = await p.pay(body);
      const json = (await res.clone().json()) as { choices: unknown[]; usage: { completion_tokens: number } };
      expect(json.choices).toHaveLength(n);
      expect(json.usage.completion_tokens).toBe(8 * n);
      answers.push(await served(res, body));
    }
    // Four choices cost four times the output of one (same input bound but for the n field).
    expect(answers[1]!.cost).toBeGreaterThan(answers[0]!.cost * 3n);
    const spent = await expectMoneyAddsUp(p.manager.channelId!, answers);
    await closeToExactBalances(p, spent, payeeBefore);
  });

  it("a first paid request whose model fails keeps its channel: the same mppx client pays on it with no second open, and close refunds the whole unspent deposit", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer();

    // The upstream answers 500 to the request that carries the open, after the open was broadcast.
    const first = chatBody("first request, the model fails");
    const runs = modelRuns();
    upstream.configure({ failure: { status: 500 } });
    let failed: Awaited<ReturnType<typeof p.pay>>;
    try {
      failed = await p.pay(first);
    } finally {
      upstream.configure({ failure: undefined });
    }
    expect(modelRuns()).toBeGreaterThan(runs);
    expect(failed.status).toBe(502);
    expect(failed.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    const problem = (await failed.json()) as { code: string; error: { code: string; type: string } };
    expect(problem.code).toBe("upstream_error");
    expect(problem.error).toMatchObject({ code: "upstream_error", type: "server_error" });
    expect(p.wire.entries.filter((e) => e.body.length > 0).map(actionOf)).toEqual([undefined, "open"]);
    const open = p.wire.entries.find((e) => actionOf(e) === "open")!;
    const { channelId } = Credential.deserialize(open.authorization!).payload as { channelId: string };
    // The open was broadcast: the deposit is locked in the channel the gateway recorded.
    const { deposit } = await channelState(channelId);
    expect(deposit).toBeGreaterThan(0n);
    expect(await balanceOf(stack.tempoRpcUrl, p.payer.address)).toBe(FUNDING - deposit);

    // The failed answer carried the accepted open's receipt (nothing charged), and mppx kept
    // the channel.
    expect(failed.receipt).toMatchObject({ channelId, spent: "0", status: "success" });
    expect(p.manager.channelId).toBe(channelId);

    // The next request pays on that channel: a voucher, no second open, no second deposit.
    const second = chatBody("second request");
    const paid = await served(await p.pay(second), second);
    expect(paid.receipt.channelId).toBe(channelId);
    const credentials = p.wire.entries.map(actionOf).filter((a) => a !== undefined);
    expect(credentials).toEqual(["open", "voucher"]);
    expect(await balanceOf(stack.tempoRpcUrl, p.payer.address)).toBe(FUNDING - deposit);

    const spent = await expectMoneyAddsUp(channelId, [paid]);
    await closeToExactBalances(p, spent, payeeBefore);
  });

  it("our agent client keeps the channel of a failed first request too, and closes to the exact balances", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const key = generatePrivateKey();
    const payer = privateKeyToAccount(key);
    await fund(stack.tempoRpcUrl, payer.address, FUNDING);
    const wire = wireRecorder();
    wires.push(wire.entries);
    const session = new PaidSession({
      url: stack.url,
      privateKey: key,
      rpcUrl: stack.tempoRpcUrl,
      maxDeposit: 20_000_000n,
      fetch: wire.fetch,
    });
    upstream.configure({ failure: { status: 500 } });
    let refused: unknown;
    try {
      refused = await session.chat(chatBody("agent client, the model fails")).then(
        () => undefined,
        (err: unknown) => err,
      );
    } finally {
      upstream.configure({ failure: undefined });
    }
    expect(refused).toBeInstanceOf(PaidSessionError);
    expect((refused as PaidSessionError).code).toBe("http_error");
    expect((refused as PaidSessionError).details).toMatchObject({
      status: 502,
      serverCode: "upstream_error",
    });
    const channelId = session.channelId!;
    expect(channelId).toMatch(/^0x[0-9a-f]{64}$/);
    const { deposit } = await channelState(channelId);
    expect(await balanceOf(stack.tempoRpcUrl, payer.address)).toBe(FUNDING - deposit);

    const body = chatBody("agent client, second request");
    const res = await session.chat(body);
    expect(res.status).toBe(200);
    expect(res.channelId).toBe(channelId);
    expect(res.voucher).toBe("reused");
    expect(wire.entries.map(actionOf).filter((a) => a !== undefined)).toEqual(["open", "voucher"]);
    const cost = servedCost(body, planDefault("Starter"));
    expect(BigInt(res.receipt.spent)).toBe(cost);
    expect(await settledState(channelId)).toMatchObject({ spent: cost, held: 0n, liveHolds: 0 });

    const closed = await session.close();
    expect(closed?.spent).toBe(cost);
    expect((await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(cost);
    expect(await balanceOf(stack.tempoRpcUrl, payer.address)).toBe(FUNDING - cost);
  });

  it("one request at a time, then a close sent right after the last answer: the close pays exactly the committed spend, the last request included, and no receipt claimed more", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer();
    const answers: Served[] = [];
    for (const [i, plan] of (["Starter", "Premium", "Starter", "Premium"] as const).entries()) {
      const body = chatBody(`one at a time ${i}`, plan);
      answers.push(await served(await p.pay(body), body));
    }
    // No wait for the last Commit: the close is the next thing the payer sends.
    const closed = await p.manager.close();
    const told = answers.reduce((sum, a) => sum + a.cost, 0n);
    expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect(BigInt(closed!.spent)).toBe(told);
    for (const a of answers) expect(BigInt(a.receipt.spent)).toBeLessThanOrEqual(told);
    expect((await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(told);
    expect(await balanceOf(stack.tempoRpcUrl, p.payer.address)).toBe(FUNDING - told);
    const channelId = p.manager.channelId ?? answers[0]!.receipt.channelId;
    expect(await channelState(channelId)).toMatchObject({
      status: "closed",
      spent: told,
      units: answers.length,
      held: 0n,
      liveHolds: 0,
    });
  });

  it("api-edge gone between its answer and its Commit: metering commits the hold from the router's usage event, once, at its cost, and the close pays it", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer();
    const answers: Served[] = [];
    for (const i of [1, 2]) {
      const body = chatBody(`before the crash ${i}`);
      answers.push(await served(await p.pay(body), body));
    }
    const channelId = p.manager.channelId!;
    const told = await expectMoneyAddsUp(channelId, answers);
    const meteredBefore = await metered();

    // What api-edge does for a paid request up to its answer, as api-edge: the hold, then the
    // router's completion billed to it (the router publishes its usage event before it answers).
    // api-edge then dies: its Commit never leaves.
    const asEdge = stack.internalAuth("api-edge");
    const port = (name: string) => stack.processes.find((x) => x.name === name)!.port;
    const payment = createClient(PaymentService, `127.0.0.1:${port("mpp-payment")}`, asEdge);
    const router = createClient(InferenceService, `127.0.0.1:${port("inference-router-1")}`, asEdge);
    try {
      const body = chatBody("api-edge dies right after this answer");
      const model = planDefault("Starter");
      const raw = JSON.stringify(body);
      const quote = quoteFor(raw, model, 8).toString();
      const { reservationId } = await payment.reserve(
        { channelId, requestId: randomUUID(), quote, challengeId: "" },
        { timeoutMs: 10_000 },
      );
      const res = await router.complete(
        {
          input: {
            requestId: `edge-gone-${randomUUID()}`,
            operation: Operation.CHAT,
            model: model.id,
            maxOutputTokens: 8,
            body: Buffer.from(raw),
            billing: { door: Door.PAID, reservationId, quote, channelId },
          },
        },
        { timeoutMs: 30_000 },
      );
      const cost = BigInt(res.usage!.cost);
      expect(cost).toBe(servedCost(body, model));

      // The payer closes: the close waits for the channel's live hold, which metering commits.
      const closed = await p.manager.close();
      expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
      expect(BigInt(closed!.spent)).toBe(told + cost);
      expect((await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(told + cost);
      expect(await balanceOf(stack.tempoRpcUrl, p.payer.address)).toBe(FUNDING - told - cost);
      expect(await channelState(channelId)).toMatchObject({
        spent: told + cost,
        units: 3,
        held: 0n,
        liveHolds: 0,
      });

      // Had api-edge lived, its Commit would land now: it succeeds and charges nothing more.
      const late = await payment.commit(
        { reservationId, channelId, challengeId: "", actualCost: cost.toString() },
        { timeoutMs: 10_000 },
      );
      expect(Session.Precompile.Receipt.deserializeSessionReceipt(late.paymentReceipt).spent).toBe(
        String(told + cost),
      );
      expect((await channelState(channelId)).spent).toBe(told + cost);
      // Metered once: the request and its cost.
      const after = await metered(meteredBefore.requests + 1n);
      expect(after.requests - meteredBefore.requests).toBe(1n);
      expect(after.cost - meteredBefore.cost).toBe(cost);
    } finally {
      payment.$close();
      router.$close();
    }
  });

  it("logs hold no credential, signature, receipt (error answers' included) or prompt text", async () => {
    await new Promise((r) => setTimeout(r, 300));
    const logs = lines.join("\n");
    expect(logs).toContain("request served");
    const lower = logs.toLowerCase();
    const secrets = wireSecrets(wires.flat());
    expect(secrets.length).toBeGreaterThan(10);
    for (const s of secrets)
      expect(lower.includes(s.toLowerCase()), "a wire secret is in the logs").toBe(false);
    expect(logs).not.toContain(PAID_PROMPT_MARKER);
  });
});

/**
 * One challenge pays for one request (docs/paid-door.md, "One challenge, one request"), on the
 * same stack: a
 * captured `Authorization: Payment` credential sent again with its body, once or many times at
 * once, is refused 402 mpp_invalid_challenge with a fresh challenge, runs no model and charges
 * nothing; of one unused credential sent several times at once exactly one is served. After
 * each: what the payer was told (x-tollgate-cost, receipts) == the committed spend, no hold left.
 */
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
    expect(await settledState(channelId)).toMatchObject({
      spent: sum(told),
      held: 0n,
      units: 2,
      liveHolds: 0,
    });

    // The payer's next request: its receipt counts only the payer's own spend.
    const next = chatBody("replay 3");
    const res = await session.chat(next);
    expect(res.status).toBe(200);
    expect(told).toHaveLength(3);
    expect(BigInt(res.receipt.spent)).toBe(sum(told));
    expect(res.receipt.units).toBe(3);
    expect(await settledState(channelId)).toMatchObject({
      spent: sum(told),
      held: 0n,
      units: 3,
      liveHolds: 0,
    });

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
    expect(await settledState(channelId)).toMatchObject({ spent: sum, held: 0n, units: 2, liveHolds: 0 });
    // The payer's own client still pays and closes on the channel.
    const next = await session.chat(chatBody("concurrent 3"));
    expect(BigInt(next.receipt.spent)).toBe(told.reduce((a, b) => a + b, 0n) + BigInt(served[0]!.cost!));
    const closed = await session.close();
    expect(closed?.spent).toBe(BigInt(next.receipt.spent));
  });
});
