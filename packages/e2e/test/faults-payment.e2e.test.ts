import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import {
  freePort,
  privateRedis,
  type RedisFixture,
  uniqueNamespace,
  useNats,
} from "@tollgate/testkit/fixtures";
import { type RpcProxy, startRpcProxy } from "@tollgate/testkit/rpc-proxy";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { DEMO_PAYEE_ADDRESS } from "@tollgate/testkit/tempo-devnet";
import { Redis } from "ioredis";
import { Challenge, Credential } from "mppx";
import { tempo as tempoClient } from "mppx/client";
import { Session } from "mppx/tempo";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BUCKET,
  balanceOf,
  fund,
  PAID_PATH,
  PAID_PROMPT_MARKER,
  payerClient,
  planDefault,
  servedCost,
  wireRecorder,
} from "./paid-door-kit.js";

type SessionReceipt = ReturnType<typeof Session.Precompile.Receipt.deserializeSessionReceipt>;

/**
 * Payment faults on the multi-process stack (docs/paid-door.md, "Resilience of the paid door"), driven by the
 * unmodified mppx client: an mpp-payment replica SIGKILLed between Reserve and Commit (two
 * replicas on one Redis), the chain RPC failing or slow during open, topUp and close (a
 * fault-injecting proxy between mpp-payment and the devnet; the client reaches the devnet
 * directly), and Redis (append-only) restarted under paid traffic.
 */

/** The fake upstream answers after this long: the window in which a replica is killed. */
const MODEL_LATENCY_MS = 1_000;
/**
 * Hold lifetime: short, so a hold whose Reserve reply was lost lapses within the test, yet
 * longer than a Commit rides out a Redis restart (api-edge runs it again for up to 5 s).
 */
const RESERVATION_TTL_SECONDS = 8;
/** Per JSON-RPC request; a slow chain times out after it (plus viem's bounded retries). */
const RPC_TIMEOUT_MS = 1_000;
const FUNDING = 50_000_000n;
/** mpp-payment's Redis connection (named mpp-payment:<host>:<pid>) blocked on a script. */
const BLOCKED_SCRIPT = /name=mpp-payment:[^:\s]*:(\d+) .*flags=b .*cmd=eval/;

let stack: Stack;
let redis: RedisFixture;
let nats: Awaited<ReturnType<typeof useNats>>;
let proxy: RpcProxy;
let upstream: FakeUpstream;
let db: Redis;
let prefix: string;
/** Every line the gateway's processes printed (not the devnet's banner, which names demo accounts). */
const lines: string[] = [];

const chatBody = (content: string) => ({
  plan: "Starter",
  model_optimization: true,
  max_tokens: 8,
  messages: [{ role: "user", content: `${PAID_PROMPT_MARKER} ${content}` }],
});

beforeAll(async () => {
  const namespace = uniqueNamespace("payfault");
  prefix = `tollgate:${namespace}:mpp:`;
  // A private Redis: the commit-in-flight case pauses its writes and the outage case restarts it
  // (append-only, so its data survives), which must not touch anyone else.
  [redis, nats, upstream] = await Promise.all([
    privateRedis({ appendOnly: true }),
    useNats(),
    // In process, so a test can change how long the model takes (configure).
    startFakeUpstream({ latencyMs: MODEL_LATENCY_MS, record: true }),
  ]);
  const devnetPort = await freePort();
  proxy = await startRpcProxy({ target: `http://127.0.0.1:${devnetPort}` });
  stack = await startStack({
    natsUrl: nats.url,
    redisUrl: redis.url,
    namespace,
    routers: 1,
    payments: 2,
    onLine: (service, line) => {
      if (service !== "tempo-devnet") lines.push(`${service}: ${line}`);
    },
    devnetPort,
    upstreamPort: upstream.port,
    externalUpstream: true,
    paymentEnv: {
      TEMPO_RPC_URL: proxy.url,
      TEMPO_RPC_TIMEOUT_MS: String(RPC_TIMEOUT_MS),
      MPP_RESERVATION_TTL_SECONDS: String(RESERVATION_TTL_SECONDS),
      // No settlement pass meddles with the balances or the paused Redis.
      MPP_SETTLE_INTERVAL_SECONDS: "0",
    },
  });
  db = new Redis(redis.url);
  // The test's own connection sees the Redis outage too; its commands run once Redis is back.
  db.on("error", () => {});
}, 60_000);

afterAll(async () => {
  db?.disconnect();
  await stack?.stop();
  await upstream?.close();
  await proxy?.close();
  await Promise.all([redis?.stop(), nats?.stop()]);
});

/** The channel as mpp-payment's Redis store holds it. */
async function channelState(channelId: string) {
  const key = `${prefix}ch:{${channelId.toLowerCase()}}`;
  const [ch, holds] = await Promise.all([db.hgetall(key), db.hlen(`${key}:holds`)]);
  return {
    spent: BigInt(ch["spent"] ?? "-1"),
    held: BigInt(ch["held"] ?? "-1"),
    status: ch["status"],
    liveHolds: holds,
  };
}

/** Reserve calls answered ok so far, per mpp-payment replica. */
async function reservesByReplica(): Promise<Record<string, number>> {
  return {
    "mpp-payment-1": await opsOf("mpp-payment-1", "reserve"),
    "mpp-payment-2": await opsOf("mpp-payment-2", "reserve"),
  };
}

/** The pid of the mpp-payment replica whose script waits in write-paused Redis, if any. */
async function blockedPaymentPid(): Promise<number | undefined> {
  const m = BLOCKED_SCRIPT.exec(String(await db.call("CLIENT", "LIST")));
  return m ? Number(m[1]) : undefined;
}

/** Operation counters of one mpp-payment replica (from its /metrics); -1 when it does not answer. */
async function opsOf(name: string, op: string): Promise<number> {
  const text = await fetch(stack.metricsUrls[name]!).then(
    (r) => r.text(),
    () => "",
  );
  const m = new RegExp(`tollgate_payment_operations_total\\{op="${op}",outcome="ok"\\} (\\d+)`).exec(text);
  return m ? Number(m[1]) : -1;
}

/**
 * Sends unpaid requests (a challenge each) eight at a time until both replicas have answered
 * one: api-edge sends a call to the replica with the fewest of its calls in flight, so calls
 * made one at a time all go to one replica and only overlapping ones reach the other.
 */
async function bothReplicasServe(): Promise<void> {
  const names = ["mpp-payment-1", "mpp-payment-2"];
  const before = await Promise.all(names.map((n) => opsOf(n, "challenge")));
  const probe = async () => {
    const res = await fetch(`${stack.url}${PAID_PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody("probe")),
    });
    await res.body?.cancel();
  };
  await until(
    "api-edge to reach both mpp-payment replicas",
    async () => {
      await Promise.all(Array.from({ length: 8 }, probe));
      const now = await Promise.all(names.map((n) => opsOf(n, "challenge")));
      return now.every((c, i) => c > before[i]!) ? true : undefined;
    },
    20_000,
  );
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * The channel once no hold is live: a paid answer goes out before its Commit lands
 * (docs/paid-door.md, "One round trip"), so the books are read when that Commit has.
 */
async function settledState(channelId: string) {
  return until("the channel's holds to settle", async () => {
    const state = await channelState(channelId);
    return state.liveHolds === 0 && state.held === 0n ? state : undefined;
  });
}

/** A fresh funded payer with an unmodified mppx session manager. */
async function newPayer(maxDeposit: string) {
  const payer = privateKeyToAccount(generatePrivateKey());
  await fund(stack.tempoRpcUrl, payer.address, FUNDING);
  const wire = wireRecorder();
  const manager = tempoClient.session.manager({
    account: payer,
    client: payerClient(stack.tempoRpcUrl, payer),
    maxDeposit,
    fetch: wire.fetch,
  });
  const pay = (content: string) =>
    manager.fetch(`${stack.url}${PAID_PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chatBody(content)),
    });
  return { payer, manager, wire, pay };
}

/**
 * Sends the payer's last close credential again with a fresh challenge (the spec's caller
 * action for mpp_session_close_failed: "retry the close credential"). The mppx manager marks
 * its channel closed as soon as it signs a close, so a second manager.close() sends nothing;
 * the signed close voucher stays valid, and mppx's own Credential re-wraps it.
 */
async function retryClose(p: Awaited<ReturnType<typeof newPayer>>): Promise<SessionReceipt | undefined> {
  const sent = p.wire.entries.filter((e) => e.authorization && e.body === "").at(-1)!;
  const previous = Credential.deserialize(sent.authorization!);
  expect((previous.payload as { action: string }).action).toBe("close");
  const unpaid = await fetch(`${stack.url}${PAID_PATH}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(chatBody("a fresh challenge")),
  });
  expect(unpaid.status).toBe(402);
  const challenge = Challenge.fromResponse(unpaid);
  const credential = Credential.serialize(
    Credential.from({
      challenge,
      payload: previous.payload,
      ...(previous.source ? { source: previous.source } : {}),
    }),
  );
  const res = await p.wire.fetch(`${stack.url}${PAID_PATH}`, {
    method: "POST",
    headers: { authorization: credential },
  });
  expect(res.status).toBe(204);
  const header = res.headers.get("payment-receipt");
  return header ? Session.Precompile.Receipt.deserializeSessionReceipt(header) : undefined;
}

/** Close through the gateway: the payee gets exactly the committed spend, the payer keeps the rest. */
async function closeAndCheckBalances(
  p: Awaited<ReturnType<typeof newPayer>>,
  receipts: SessionReceipt[],
  payeeBefore: bigint,
  close: () => Promise<SessionReceipt | undefined> = () => p.manager.close(),
) {
  const spent = receipts.reduce((max, r) => (BigInt(r.spent) > max ? BigInt(r.spent) : max), 0n);
  const closed = await close();
  expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
  // The receipts are the spend read with each hold plus its cost: the last one, taken with no
  // other hold live, is the committed spend the close pays.
  expect(BigInt(closed!.spent)).toBe(spent);
  expect((await channelState(p.manager.channelId!)).liveHolds).toBe(0);
  expect((await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(spent);
  expect(FUNDING - (await balanceOf(stack.tempoRpcUrl, p.payer.address))).toBe(spent);
}

/** What one paid request of the Redis-outage loop came to, as its caller saw it. */
interface PaidOutcome {
  content: string;
  status: number;
  /** performance.now() when the caller sent it and when the answer was read. */
  startedAt: number;
  endedAt: number;
  receipt: SessionReceipt | undefined;
  contentType: string | undefined;
  /** The problem body of an error answer. */
  problem?: {
    status?: number;
    code?: string;
    request_id?: string;
    error?: { type?: string; code?: string; request_id?: string };
  };
  /** mppx threw instead of answering (it never should here). */
  thrown?: string;
}

/**
 * Paid requests one after another on one session manager (mppx is single-flight) until
 * `stop()` says so or `max` were sent; after a refusal the caller backs off (100, 200, 400 ms),
 * as the spec's 5xx rule asks.
 */
async function payLoop(
  p: Awaited<ReturnType<typeof newPayer>>,
  name: string,
  stop: (outcomes: PaidOutcome[]) => boolean,
  max: number,
): Promise<PaidOutcome[]> {
  const outcomes: PaidOutcome[] = [];
  let backoff = 100;
  for (let i = 0; i < max && !stop(outcomes); i++) {
    const content = `${name} ${i}`;
    const startedAt = performance.now();
    const o: PaidOutcome = {
      content,
      status: -1,
      startedAt,
      endedAt: 0,
      receipt: undefined,
      contentType: undefined,
    };
    try {
      const res = await p.pay(content);
      const text = await res.text();
      o.status = res.status;
      o.receipt = res.receipt ?? undefined;
      o.contentType = res.headers.get("content-type") ?? undefined;
      if (res.status !== 200) {
        try {
          o.problem = JSON.parse(text) as PaidOutcome["problem"];
        } catch {
          // not JSON: the assertion on the body shows it
        }
      }
    } catch (err) {
      o.thrown = (err as Error).message;
    }
    o.endedAt = performance.now();
    outcomes.push(o);
    if (o.status === 200) backoff = 100;
    else {
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 400);
    }
  }
  return outcomes;
}

/** Holds of a channel that have not lapsed yet (the store sweeps lapsed ones on its next script). */
async function unexpiredHolds(channelId: string): Promise<number> {
  return db.zcount(`${prefix}ch:{${channelId.toLowerCase()}}:exp`, `(${Date.now()}`, "+inf");
}

describe("payment faults on the multi-process stack", () => {
  it("an mpp-payment replica SIGKILLed between Reserve and Commit: the other replica commits once, the receipt matches", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer("20");
    const mini = planDefault("Starter");
    const receipts: SessionReceipt[] = [];
    const first = await p.pay("fault 1");
    expect(first.status).toBe(200);
    await first.text();
    receipts.push(first.receipt!);
    const channelId = p.manager.channelId!;

    // Reserve done, model running: find the replica that holds it, and kill it.
    const before = await reservesByReplica();
    const pending = p.pay("fault 2");
    await until("a live hold", async () =>
      (await channelState(channelId)).liveHolds > 0 ? true : undefined,
    );
    // The model is running: api-edge has the hold's id (the reply that carried it arrived).
    await until("the model running", async () =>
      upstream.requests.some((r) => JSON.stringify(r.body ?? "").includes("fault 2")) ? true : undefined,
    );
    const after = await reservesByReplica();
    const reserver = Object.keys(after).find((n) => after[n]! > before[n]!);
    expect(reserver).toBeDefined();
    await stack.stopProcess(reserver!, "SIGKILL");
    const second = await pending;
    expect(second.status).toBe(200);
    await second.text();
    const receipt = second.receipt!;
    expect(BigInt(receipt.spent) - BigInt(receipts[0]!.spent)).toBe(servedCost(chatBody("fault 2"), mini));
    expect(receipt.units).toBe(2);
    receipts.push(receipt);
    // Committed exactly once, nothing left held.
    expect(await settledState(channelId)).toMatchObject({ spent: BigInt(receipt.spent), liveHolds: 0 });

    // Back to two replicas, both connected to api-edge (each has answered a challenge).
    await stack.startProcess(reserver!);
    await bothReplicasServe();

    // The replica that took the Commit dies while the Commit is stuck in (write-paused) Redis:
    // it never ran there, and api-edge runs it again on the other replica.
    const third = p.pay("fault 3");
    await until("a live hold", async () =>
      (await channelState(channelId)).liveHolds > 0 ? true : undefined,
    );
    await db.call("CLIENT", "PAUSE", "20000", "WRITE");
    let committer: string | undefined;
    try {
      const pid = await until("a commit blocked in Redis", async () => blockedPaymentPid(), 8_000).catch(
        async (err: unknown) => {
          console.log(String(await db.call("CLIENT", "LIST")));
          throw err;
        },
      );
      committer = stack.processes.find((x) => x.child.pid === pid)?.name;
      expect(committer).toMatch(/^mpp-payment-/);
      await stack.stopProcess(committer!, "SIGKILL");
      await until("the killed replica's connection to go", async () =>
        (await blockedPaymentPid()) === undefined ? true : undefined,
      );
    } finally {
      await db.call("CLIENT", "UNPAUSE");
    }
    const res3 = await third;
    if (res3.status !== 200) console.log(lines.filter((l) => /"level":"(warn|error)"/.test(l)).join("\n"));
    expect(res3.status).toBe(200);
    await res3.text();
    receipts.push(res3.receipt!);
    expect(res3.receipt!.units).toBe(3);
    expect(await settledState(channelId)).toMatchObject({ spent: BigInt(res3.receipt!.spent), liveHolds: 0 });
    await stack.startProcess(committer!);

    // Every 200 carried a receipt; the close pays exactly what the receipts say.
    const paid = p.wire.entries.filter((e) => e.authorization && e.body.length > 0 && e.status === 200);
    expect(paid.every((e) => e.receipt)).toBe(true);
    await closeAndCheckBalances(p, receipts, payeeBefore);
  });

  it("the chain RPC failing at open: refused in bounded time with nothing on chain; the same client opens once it heals", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer("20");
    proxy.set("eth_sendRawTransaction", { kind: "fail", status: 503 });
    const started = Date.now();
    const refused = await p.pay("open while the chain is down");
    const elapsed = Date.now() - started;
    proxy.reset();
    // Each credentialed retry of mppx was refused 402 mpp_payment_verification_failed with a
    // fresh challenge; none reached a model, none carried a receipt.
    expect(refused.status).toBe(402);
    const paid = p.wire.entries.filter((e) => e.authorization);
    expect(paid.length).toBeGreaterThan(0);
    for (const e of paid)
      expect([e.status, e.code, e.receipt]).toEqual([402, "mpp_payment_verification_failed", undefined]);
    expect(elapsed).toBeLessThan(10 * RPC_TIMEOUT_MS);
    // Nothing was broadcast: the payer's funds are all where they were.
    expect(await balanceOf(stack.tempoRpcUrl, p.payer.address)).toBe(FUNDING);

    const ok = await p.pay("open after the chain healed");
    expect(ok.status).toBe(200);
    await ok.text();
    await closeAndCheckBalances(p, [ok.receipt!], payeeBefore);
  });

  it("a slow chain at open and a close whose answer is lost: both found on chain, nothing stranded", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer("20");
    // The node takes the open at once but answers after the adapter gave up on it.
    proxy.set("eth_sendRawTransaction", { kind: "delay", ms: 3 * RPC_TIMEOUT_MS });
    const started = Date.now();
    const opened = await p.pay("open on a slow chain");
    expect(Date.now() - started).toBeLessThan(10 * RPC_TIMEOUT_MS + MODEL_LATENCY_MS);
    proxy.reset();
    expect(opened.status).toBe(200);
    await opened.text();
    // One open, acknowledged: the client kept the channel it funded.
    expect(p.wire.entries.filter((e) => e.authorization).map((e) => e.status)).toEqual([200]);

    // The close transaction reaches the node, the answer is lost on the way back.
    proxy.set("eth_sendRawTransaction", { kind: "drop", forward: true });
    try {
      await closeAndCheckBalances(p, [opened.receipt!], payeeBefore);
    } finally {
      proxy.reset();
    }
  });

  it("the chain RPC failing at topUp and at close: the spec's codes, then the same client tops up and closes to the base unit", async () => {
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const p = await newPayer("20");
    const receipts: SessionReceipt[] = [];
    const first = await p.pay("before the top-up");
    expect(first.status).toBe(200);
    await first.text();
    receipts.push(first.receipt!);

    // The client's own top-up (a bodyless management POST) while the chain refuses transactions.
    proxy.set("eth_sendRawTransaction", { kind: "fail", status: 502 });
    const firstTopUp = p.wire.entries.length;
    const started = Date.now();
    const refused = await p.manager.topUp("1").then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(Date.now() - started).toBeLessThan(10 * RPC_TIMEOUT_MS);
    proxy.reset();
    // The 402 of a bodyless request binds no challenge, so mppx surfaces it as an error.
    expect(refused).toBeInstanceOf(Error);
    const topUps = p.wire.entries.slice(firstTopUp).filter((e) => e.authorization && e.body === "");
    expect(topUps.length).toBeGreaterThan(0);
    for (const e of topUps) expect([e.status, e.code]).toEqual([402, "mpp_payment_verification_failed"]);
    expect(FUNDING - (await balanceOf(stack.tempoRpcUrl, p.payer.address))).toBe(5n * BUCKET);

    // Healed: the same client tops up and pays on.
    const toppedUp = await p.manager.topUp("1");
    expect(toppedUp?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect(FUNDING - (await balanceOf(stack.tempoRpcUrl, p.payer.address))).toBe(6n * BUCKET);
    const second = await p.pay("after the chain healed");
    expect(second.status).toBe(200);
    await second.text();
    receipts.push(second.receipt!);

    // Close while the chain refuses transactions: mpp_session_close_failed, the session stays open.
    proxy.set("eth_sendRawTransaction", { kind: "fail", status: 503 });
    const firstClose = p.wire.entries.length;
    const closeFailed = await p.manager.close().catch((e: unknown) => e as Error);
    proxy.reset();
    expect(closeFailed).toBeInstanceOf(Error);
    const closes = p.wire.entries.slice(firstClose).filter((e) => e.authorization);
    expect(closes.map((e) => [e.status, e.code])).toEqual([[502, "mpp_session_close_failed"]]);
    expect((await channelState(p.manager.channelId!)).status).toBe("open");
    await closeAndCheckBalances(p, receipts, payeeBefore, () => retryClose(p));
  });

  it("Redis restarted (append-only) under paid traffic: fast 503s during the outage, no receipt without a commit, nothing lost", async () => {
    const mini = planDefault("Starter");
    const DOWN_MS = 1_500;
    // A quick model, so each session sends many requests around the outage; A's Reserve still
    // holds long enough for Redis to go down before its Commit.
    upstream.configure({ latencyMs: 400 });
    try {
      const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
      // Two sessions, each opened and paid before the outage, with deposit for every voucher
      // the loops can sign (mppx signs one more bucket per request, refused ones included).
      const sessions = [await newPayer("40"), await newPayer("40")];
      const before: PaidOutcome[][] = [];
      for (const [i, p] of sessions.entries()) {
        before.push(await payLoop(p, `redis ${"AB"[i]} before`, () => false, 2));
        expect(before[i]!.map((o) => [o.status, o.receipt !== undefined])).toEqual([
          [200, true],
          [200, true],
        ]);
        expect((await p.manager.topUp("30"))?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
      }
      const [a, b] = sessions as [(typeof sessions)[0], (typeof sessions)[0]];
      const channels = sessions.map((p) => p.manager.channelId!);

      let down = Number.POSITIVE_INFINITY;
      let up = Number.POSITIVE_INFINITY;
      // Each session goes on until it was served at least once a second after Redis came back.
      const servedAfterUp = (outcomes: PaidOutcome[]) =>
        performance.now() > up + 1_000 && outcomes.some((o) => o.status === 200 && o.startedAt > up);
      const loopA = payLoop(a, "redis A", servedAfterUp, 30);
      // Redis goes down while A's request holds its Reserve and the model runs: its Commit meets
      // the outage.
      await until("a live hold on A's channel", async () =>
        (await channelState(channels[0]!)).liveHolds > 0 ? true : undefined,
      );
      down = performance.now();
      const restart = redis.restart({ downMs: DOWN_MS }).then(() => {
        up = performance.now();
      });
      // B starts once Redis is gone: its first requests meet the outage.
      await until("Redis to go down", async () => (db.status !== "ready" ? true : undefined), 5_000);
      const loopB = payLoop(b, "redis B", servedAfterUp, 30);
      await restart;
      const [outA, outB] = await Promise.all([loopA, loopB]);
      const all = [...outA, ...outB];

      // Every answer: a 200 with its receipt, or a fast retryable 503 with the spec's body.
      const shape = (o: PaidOutcome) => {
        if (o.status === 200) return o.receipt ? "200 receipt" : "200 WITHOUT RECEIPT";
        const fastMs = o.endedAt - Math.max(o.startedAt, down);
        return [
          o.status,
          o.thrown ?? o.problem?.error?.type,
          o.problem?.code,
          o.problem?.status === o.status &&
          o.problem?.error?.code === o.problem?.code &&
          typeof o.problem?.request_id === "string" &&
          o.problem.request_id === o.problem.error?.request_id
            ? "spec body"
            : "OTHER BODY",
          /^application\/problem\+json/.test(o.contentType ?? "") ? "problem+json" : o.contentType,
          fastMs < 1_000 ? "fast" : `slow ${Math.round(fastMs)} ms`,
        ].join(" ");
      };
      const shapes: Record<string, number> = {};
      for (const o of all) shapes[shape(o)] = (shapes[shape(o)] ?? 0) + 1;
      const refused = all.filter((o) => o.status !== 200);
      const fast503 = refused.map((o) => o.endedAt - Math.max(o.startedAt, down));
      console.log(
        `Redis outage ${Math.round(up - down)} ms; ${all.length} paid requests (A ${outA.length}, B ${outB.length}): ` +
          `${JSON.stringify(shapes)}; refusals answered in at most ${Math.round(Math.max(...fast503))} ms`,
      );
      const allowed = new Set([
        "200 receipt",
        "503 server_error service_unavailable spec body problem+json fast",
      ]);
      expect(Object.keys(shapes).filter((k) => !allowed.has(k))).toEqual([]);
      expect(refused.length).toBeGreaterThan(0);
      // A's request in flight when Redis went down was committed once Redis answered, and paid.
      const inFlight = outA.find((o) => o.startedAt < down && o.endedAt > down);
      console.log(
        `Redis outage: A's request in flight answered ${inFlight?.status} after ${Math.round((inFlight?.endedAt ?? 0) - down)} ms`,
      );
      expect(inFlight?.status).toBe(200);
      expect(inFlight?.receipt).toBeDefined();
      // On the wire too: every paid 200 carried a receipt, and no 500 was ever answered.
      for (const p of sessions) {
        const paid = p.wire.entries.filter((e) => e.authorization && e.body.length > 0);
        expect(paid.filter((e) => e.status === 200 && !e.receipt)).toEqual([]);
        expect(p.wire.entries.filter((e) => e.status >= 500 && e.status !== 503)).toEqual([]);
      }

      // Nothing lost, nothing counted twice: the store's spend is the sum of the served requests'
      // costs, and the last receipt's (taken once every Commit had landed). A receipt taken while
      // an earlier Commit was still on its way (retried through the outage) counts from the spend
      // before it: never above the spend, and covering its own cost. The same session pays on.
      const receipts: SessionReceipt[][] = [];
      for (const [i, p] of sessions.entries()) {
        // A hold whose Reserve answer the outage lost lapses with its TTL; the next request
        // sweeps it.
        await until(
          "no unexpired hold",
          async () => ((await unexpiredHolds(channels[i]!)) === 0 ? true : undefined),
          (RESERVATION_TTL_SECONDS + 5) * 1_000,
        );
        const after = await payLoop(p, `redis ${"AB"[i]} after`, () => false, 1);
        const served = [...before[i]!, ...(i === 0 ? outA : outB), ...after].filter((o) => o.status === 200);
        expect(after.map((o) => [o.status, o.receipt !== undefined])).toEqual([[200, true]]);
        const spent = served.reduce((sum, o) => sum + servedCost(chatBody(o.content), mini), 0n);
        for (const [n, o] of served.entries()) {
          const r = o.receipt!;
          expect(r.channelId).toBe(p.manager.channelId);
          expect(BigInt(r.spent)).toBeGreaterThanOrEqual(servedCost(chatBody(o.content), mini));
          expect(BigInt(r.spent)).toBeLessThanOrEqual(spent);
          expect(r.units).toBeLessThanOrEqual(n + 1);
        }
        expect(served.at(-1)!.receipt).toMatchObject({ spent: String(spent), units: served.length });
        expect(await settledState(channels[i]!)).toEqual({ spent, held: 0n, status: "open", liveHolds: 0 });
        receipts.push(served.map((o) => o.receipt!));
      }
      console.log(
        `Redis outage: spent A ${receipts[0]!.at(-1)!.spent}, B ${receipts[1]!.at(-1)!.spent} base units`,
      );

      // Closing pays the payee exactly the committed spend; each payer keeps the rest.
      await closeAndCheckBalances(a, receipts[0]!, payeeBefore);
      await closeAndCheckBalances(b, receipts[1]!, payeeBefore + BigInt(receipts[0]!.at(-1)!.spent));
    } finally {
      upstream.configure({ latencyMs: MODEL_LATENCY_MS });
    }
  }, 50_000);
});
