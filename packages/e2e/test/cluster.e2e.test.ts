import { jetstreamManager } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { ensureStream } from "@tollgate/kit/nats";
import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { natsNames } from "@tollgate/proto/subjects";
import {
  type NatsClusterFixture,
  type RedisClusterFixture,
  startNatsCluster,
  startRedisCluster,
} from "@tollgate/testkit/cluster";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { uniqueNamespace } from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { DEMO_PAYEE_ADDRESS } from "@tollgate/testkit/tempo-devnet";
import { tempo as tempoClient } from "mppx/client";
import type { Session } from "mppx/tempo";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminCreate } from "./gateways.js";
import {
  balanceOf,
  fund,
  PAID_PATH,
  PAID_PROMPT_MARKER,
  payerClient,
  planDefault,
  servedCost,
  wireRecorder,
} from "./paid-door-kit.js";
import * as traffic from "./traffic.js";
import { load, type Outcome, summary } from "./traffic.js";

/**
 * The multi-process stack on a Redis Cluster (3 masters, 3 replicas) and a three-node NATS
 * JetStream cluster (usage stream R3), all private on loopback (docs/kubernetes.md, "Redis
 * Cluster and a NATS cluster"). Under traffic on the account door one Redis master is killed (its
 * replica takes over after cluster-node-timeout), then another under a paying session, then the
 * NATS node leading the usage stream. Afterwards the money adds up as in faults.e2e.test.ts and
 * faults-payment.e2e.test.ts: what callers were told they spent == budget spent == metering's
 * analytics, token and request counts exact, no hold left; each receipt adds its request's cost,
 * and the channel closes to the base unit.
 * What callers saw during each failover is printed (docs/runbooks/README.md, "Redis Cluster or
 * NATS node failover").
 */
describe("Redis Cluster and NATS cluster: masters and a stream leader fail under traffic", () => {
  const namespace = uniqueNamespace("cluster");
  const prefix = `tollgate:${namespace}:`;
  const BUDGET = 10n ** 15n;
  const RESERVATION_TTL_SECONDS = 6;
  let redisCluster: RedisClusterFixture;
  let natsCluster: NatsClusterFixture;
  let upstream: FakeUpstream;
  let stack: Stack;
  let peek: Redis;
  let nc: NatsConnection;

  beforeAll(async () => {
    [redisCluster, natsCluster, upstream] = await Promise.all([
      startRedisCluster({ masters: 3, replicas: 1, nodeTimeoutMs: 1_000 }),
      startNatsCluster({ size: 3 }),
      startFakeUpstream({ tokensPerSecond: 200, outputTokens: 1_000, record: true }),
    ]);
    stack = await startStack({
      natsUrl: natsCluster.url,
      redisUrl: redisCluster.url,
      namespace,
      routers: 1,
      upstreamPort: upstream.port,
      externalUpstream: true,
      serviceEnv: { NATS_STREAM_REPLICAS: "3" },
      paymentEnv: {
        // Short holds, so one whose Reserve answer died with the master lapses within the test.
        MPP_RESERVATION_TTL_SECONDS: String(RESERVATION_TTL_SECONDS),
        // No settlement pass moves the balances the paid case checks.
        MPP_SETTLE_INTERVAL_SECONDS: "0",
      },
    });
    peek = connectRedis(redisCluster.url, "cluster-e2e");
    peek.on("error", () => {});
    nc = await connect({
      servers: natsCluster.url.split(","),
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
    });
  }, 90_000);

  afterAll(async () => {
    if (nc) await nc.close().catch(() => undefined);
    if (peek) await quitRedis(peek);
    await stack?.stop();
    await upstream?.close();
    await Promise.all([redisCluster?.stop(), natsCluster?.stop()]);
  }, 30_000);

  const admin = (path: string, body: unknown) => adminCreate(stack, path, body);

  /** A fresh account with one budgeted connection; returns its key. */
  async function account(id: string): Promise<string> {
    await admin("/admin/v1/accounts", { id });
    await admin(`/admin/v1/accounts/${id}/connections`, {
      id: `${id}-conn`,
      models: ["tollgate-mini"],
      budget: { amount: BUDGET.toString() },
    });
    const { secret } = (await admin(`/admin/v1/accounts/${id}/connections/${id}-conn/keys`, {})) as {
      secret: string;
    };
    return secret;
  }

  const ledgers = (): traffic.Ledgers => ({
    adminUrl: stack.adminUrls[0]!,
    adminToken: stack.adminToken,
    peek,
    prefix,
  });
  const send = (key: string, i: number, t0: () => number, stream: boolean) =>
    traffic.sendChat(stack.url, key, i, { stream, maxTokens: 4, t0 });
  const settledBooks = (accountId: string, requests: number, timeoutMs?: number) =>
    traffic.settledBooks(ledgers(), accountId, requests, timeoutMs);
  const read = traffic.retryRead;

  /** The caller's view of a failover, printed: outcomes, the first and last failure, the slowest. */
  function report(label: string, outcomes: Outcome[], extra: Record<string, unknown>): void {
    const failed = outcomes.filter((o) => o.status !== 200);
    const ms = outcomes.map((o) => o.ms).sort((a, b) => a - b);
    const pct = (p: number) => Math.round(ms[Math.min(ms.length - 1, Math.floor(p * ms.length))] ?? 0);
    console.log(
      `${label}: ${JSON.stringify({
        ...extra,
        requests: outcomes.length,
        outcomes: summary(outcomes),
        failedFromMs: failed.length ? Math.min(...failed.map((o) => o.at)) : null,
        failedUntilMs: failed.length ? Math.max(...failed.map((o) => o.at + o.ms)) : null,
        latencyMs: { p50: pct(0.5), p99: pct(0.99), max: Math.round(ms.at(-1) ?? 0) },
      })}`,
    );
  }

  it("runs the usage stream with three replicas, and raises a stream made with fewer", async () => {
    const jsm = await jetstreamManager(nc);
    const info = await jsm.streams.info(natsNames(namespace).usageStream);
    expect(info.config.num_replicas).toBe(3);
    expect(info.cluster?.replicas?.length).toBe(2);
    // A stream created before with one replica (as the services did before NATS_STREAM_REPLICAS).
    const name = `${natsNames(namespace).usageStream}_R1`;
    const spec = { name, subjects: [`${namespace}.r1.>`], storage: "memory" as const };
    try {
      await ensureStream(nc, { ...spec, replicas: 1 });
      expect((await jsm.streams.info(name)).config.num_replicas).toBe(1);
      await ensureStream(nc, { ...spec, replicas: 3 });
      expect((await jsm.streams.info(name)).config.num_replicas).toBe(3);
      // Never lowered.
      await ensureStream(nc, { ...spec, replicas: 1 });
      expect((await jsm.streams.info(name)).config.num_replicas).toBe(3);
    } finally {
      await jsm.streams.delete(name).catch(() => undefined);
    }
  });

  it("fails over the Redis master of an account's slot under traffic: fast 503s for that account only, nothing lost or counted twice", async () => {
    // The account's master holds neither the key store's slot nor the control account's, so the
    // failover shows what it costs the accounts of one master, and that the others are not touched.
    const keysMaster = await redisCluster.masterOf("{keys}");
    let accountId = "";
    for (let i = 0; !accountId; i++)
      if ((await redisCluster.masterOf(`{redis-failover-${i}}`)) !== keysMaster)
        accountId = `redis-failover-${i}`;
    const victim = await redisCluster.masterOf(`{${accountId}}`);
    let controlId = "";
    for (let i = 0; !controlId; i++)
      if ((await redisCluster.masterOf(`{control-${i}}`)) !== victim) controlId = `control-${i}`;
    const [key, controlKey] = [await account(accountId), await account(controlId)];
    const usageOnVictim = (await redisCluster.masterOf("{usage}")) === victim;
    let t0 = 0;
    let failoverMs = 0;
    const fault = (async () => {
      await new Promise((r) => setTimeout(r, 1_000));
      t0 = Date.now();
      await redisCluster.kill(victim);
      failoverMs = await redisCluster.waitForFailover(victim, t0);
      await new Promise((r) => setTimeout(r, 2_000));
    })();
    const [outcomes, control] = await Promise.all([
      load(3, fault, (n) => send(key, n, () => t0 || Date.now(), n % 3 === 0)),
      load(2, fault, (n) => send(controlKey, n, () => t0 || Date.now(), n % 3 === 0)),
    ]);
    report("redis master killed, its account", outcomes, { failoverMs, usageOnVictim });
    report("redis master killed, an account on another master", control, {});

    const served = outcomes.filter((o) => o.status === 200);
    const failed = outcomes.filter((o) => o.status !== 200);
    expect(outcomes.length).toBeGreaterThan(20);
    expect(failed.length).toBeGreaterThan(0);
    // Callers of the failed slot got the retryable 503 with the request id, fast.
    for (const o of failed) {
      expect(o.status, o.tail).toBe(503);
      expect(o.errorType).toBe("server_error");
      expect(o.requestIdInBody).toBe(true);
      expect(o.ms).toBeLessThan(3_000);
    }
    // The other master's account was served throughout, but for at most one request in flight at
    // the very moment the master died (seen once in CI: a 503 at 0–232 ms; which of the cluster
    // client's commands failed is not known yet, see docs/runbooks/README.md).
    const controlFailed = control.filter((o) => o.status !== 200);
    expect(controlFailed.length, JSON.stringify(summary(controlFailed))).toBeLessThanOrEqual(1);
    for (const o of controlFailed) {
      expect(o.status).toBe(503);
      expect(o.at).toBeLessThan(300);
    }
    // After the failover the account is served again.
    expect(served.some((o) => o.at > failoverMs)).toBe(true);
    for (const [id, list] of [
      [accountId, served],
      [controlId, control],
    ] as const) {
      for (const o of list) {
        if (o.streamed) expect(o.done).toBe(true);
        expect(o.tokens).toBe(4);
        expect(o.cost).toBeGreaterThan(0n);
      }
      const told = list.reduce((sum, o) => sum + o.cost, 0n);
      const b = await settledBooks(id, list.length);
      expect(b.requests, id).toBe(list.length);
      expect(b.outputTokens).toBe(list.length * 4);
      expect(b.cost).toBe(told);
      expect(b.spent).toBe(told);
      expect(b.held).toBe(0n);
    }
    // The dead master comes back as a replica, so its shard can fail over again.
    await redisCluster.restart(victim);
  }, 60_000);

  it("fails over the Redis master of a payment channel's slot under paid traffic: 200 with a receipt or a fast 503, the receipts add up", async () => {
    type SessionReceipt = ReturnType<typeof Session.Precompile.Receipt.deserializeSessionReceipt>;
    const model = planDefault("Starter");
    const body = (content: string) => ({
      plan: "Starter",
      model_optimization: true,
      max_tokens: 8,
      messages: [{ role: "user", content: `${PAID_PROMPT_MARKER} ${content}` }],
    });
    // The deposit covers the loop's 60 requests at one unit each with room to spare: the mppx
    // client refuses to sign past it, whatever the gateway answers.
    const FUNDING = 100_000_000n;
    const payeeBefore = await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS);
    const payer = privateKeyToAccount(generatePrivateKey());
    await fund(stack.tempoRpcUrl, payer.address, FUNDING);
    const wire = wireRecorder();
    const manager = tempoClient.session.manager({
      account: payer,
      client: payerClient(stack.tempoRpcUrl, payer),
      maxDeposit: "90",
      fetch: wire.fetch,
    });
    interface Paid {
      content: string;
      status: number;
      at: number;
      ms: number;
      receipt?: SessionReceipt;
      code?: string;
      thrown?: string;
    }
    let t0 = 0;
    const pay = async (content: string): Promise<Paid> => {
      const started = performance.now();
      const at = t0 ? Date.now() - t0 : -1;
      try {
        const res = await manager.fetch(`${stack.url}${PAID_PATH}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body(content)),
        });
        const text = await res.text();
        const code = res.status === 200 ? undefined : (JSON.parse(text) as { code?: string }).code;
        return {
          content,
          status: res.status,
          at,
          ms: performance.now() - started,
          ...(res.receipt ? { receipt: res.receipt } : {}),
          ...(code ? { code } : {}),
        };
      } catch (err) {
        return { content, status: -1, at, ms: performance.now() - started, thrown: (err as Error).message };
      }
    };
    // Open the channel (and pay once) before the fault.
    const first = await pay("before");
    expect(first.status).toBe(200);
    const channelId = manager.channelId!;
    const victim = await redisCluster.masterOf(`{${channelId.toLowerCase()}}`);
    let failoverMs = Number.POSITIVE_INFINITY;
    const outcomes: Paid[] = [first];
    let backoff = 100;
    const fault = (async () => {
      t0 = Date.now();
      await redisCluster.kill(victim);
      failoverMs = await redisCluster.waitForFailover(victim, t0);
    })();
    // One session is single-flight: requests one after another, backing off after a refusal.
    for (let i = 0; i < 60; i++) {
      const o = await pay(`paid ${i}`);
      outcomes.push(o);
      if (o.status === 200) {
        backoff = 100;
        if (o.at > failoverMs + 1_000) break;
      } else {
        await new Promise((r) => setTimeout(r, backoff));
        backoff = Math.min(backoff * 2, 400);
      }
    }
    await fault;
    const summaryOf = (list: Paid[]) => {
      const counts: Record<string, number> = {};
      for (const o of list) {
        const k = `${o.status} ${o.thrown ? "thrown" : (o.code ?? (o.receipt ? "receipt" : "NO RECEIPT"))} ${o.ms < 1_000 ? "<1s" : ">1s"}`;
        counts[k] = (counts[k] ?? 0) + 1;
      }
      return counts;
    };
    console.log(
      `redis master of a channel killed: ${JSON.stringify({ failoverMs, requests: outcomes.length, outcomes: summaryOf(outcomes) })}`,
    );
    // Every answer: a 200 with its receipt, or a fast retryable 503; never a paid 200 without one.
    for (const o of outcomes) {
      if (o.status === 200) expect(o.receipt, o.content).toBeDefined();
      else {
        expect(o.status, `${o.content} ${o.thrown ?? o.code}`).toBe(503);
        expect(o.ms).toBeLessThan(3_000);
      }
    }
    expect(outcomes.some((o) => o.status === 200 && o.at > failoverMs)).toBe(true);
    for (const e of wire.entries)
      expect(e.status === 200 && e.authorization && e.body.length > 0 && !e.receipt).toBe(false);

    // Each receipt is the channel's committed spend when its hold was taken plus its own cost
    // (docs/paid-door.md, "One round trip"): never more than what was served up to it, and short
    // of it only by commits still on their way (retried through the failover).
    const served = outcomes.filter((o) => o.status === 200);
    let servedSum = 0n;
    for (const [n, o] of served.entries()) {
      servedSum += servedCost(body(o.content), model);
      expect(BigInt(o.receipt!.spent), o.content).toBeLessThanOrEqual(servedSum);
      expect(o.receipt!.units).toBeLessThanOrEqual(n + 1);
    }
    // A hold whose Reserve answer died with the master lapses with its TTL; then none is left,
    // and the channel's spend is the last receipt's.
    const channelKey = `${prefix}mpp:ch:{${channelId.toLowerCase()}}`;
    const deadline = Date.now() + (RESERVATION_TTL_SECONDS + 5) * 1_000;
    while (
      (await read(() => peek.zcount(`${channelKey}:exp`, `(${Date.now()}`, "+inf"))) > 0 &&
      Date.now() < deadline
    )
      await new Promise((r) => setTimeout(r, 200));
    const after = await pay("after");
    expect(after.status).toBe(200);
    const spent = BigInt(after.receipt!.spent);
    // With every earlier commit in, this receipt is exact: everything served, this one included.
    expect(spent).toBe(servedSum + servedCost(body(after.content), model));
    // Its own commit follows the answer.
    const committed = Date.now() + 10_000;
    while ((await read(() => peek.hlen(`${channelKey}:holds`))) > 0 && Date.now() < committed)
      await new Promise((r) => setTimeout(r, 100));
    const [chSpent, chHeld] = await read(() => peek.hmget(channelKey, "spent", "held"));
    expect([BigInt(chSpent ?? -1), BigInt(chHeld ?? -1)]).toEqual([spent, 0n]);
    expect(await read(() => peek.hlen(`${channelKey}:holds`))).toBe(0);
    // Closing pays the payee exactly the committed spend; the payer keeps the rest.
    const closed = await manager.close();
    expect(BigInt(closed!.spent)).toBe(spent);
    expect((await balanceOf(stack.tempoRpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(spent);
    expect(FUNDING - (await balanceOf(stack.tempoRpcUrl, payer.address))).toBe(spent);
    await redisCluster.restart(victim);
  }, 60_000);

  it("kills the NATS node leading the usage stream under traffic: every served request is billed once", async () => {
    const accountId = "nats-failover";
    const key = await account(accountId);
    const jsm = await jetstreamManager(nc);
    const stream = natsNames(namespace).usageStream;
    const leader = (await jsm.streams.info(stream)).cluster?.leader ?? "";
    const index = Number(/tollgate-test-(\d+)$/.exec(leader)?.[1] ?? "1") - 1;
    const victim = natsCluster.ports[index]!;
    let t0 = 0;
    const fault = (async () => {
      await new Promise((r) => setTimeout(r, 1_000));
      t0 = Date.now();
      await natsCluster.kill(victim);
      await new Promise((r) => setTimeout(r, 4_000));
    })();
    const outcomes = await load(4, fault, (n) => send(key, n, () => t0 || Date.now(), n % 2 === 0));
    const newLeader = (await jsm.streams.info(stream)).cluster?.leader;
    report("nats stream leader killed", outcomes, { leader, newLeader });

    // Publishing retries with the same message id until the stream has a leader again, so no
    // caller is refused; some wait.
    expect(outcomes.length).toBeGreaterThan(8);
    expect(summary(outcomes.filter((o) => o.status !== 200))).toEqual({});
    expect(newLeader).not.toBe(leader);
    for (const o of outcomes) {
      if (o.streamed) expect(o.done).toBe(true);
      expect(o.tokens).toBe(4);
      expect(o.cost).toBeGreaterThan(0n);
    }
    const told = outcomes.reduce((sum, o) => sum + o.cost, 0n);
    // A delivery whose acknowledgement died with the consumer's leader comes again after the
    // consumer's ack wait (30 s): usage of those requests lands late, once.
    const b = await settledBooks(accountId, outcomes.length, 55_000);
    console.log(`nats stream leader killed: books settled ${b.waitedMs} ms after the traffic`);
    expect(b.requests).toBe(outcomes.length);
    expect(b.outputTokens).toBe(outcomes.length * 4);
    expect(b.cost).toBe(told);
    expect(b.spent).toBe(told);
    expect(b.held).toBe(0n);
  }, 90_000);
});
