import { jetstreamManager } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { ensureStream } from "@tollgate/kit/nats";
import { connectRedis, quitRedis, type Redis, scanStream } from "@tollgate/kit/redis";
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
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminCreate } from "./gateways.js";

/**
 * The multi-process stack on a Redis Cluster (3 masters, 3 replicas) and a three-node NATS
 * JetStream cluster (usage stream R3), all private on loopback (docs/kubernetes.md, "Redis
 * Cluster and a NATS cluster"). Under traffic on the account door, one Redis master is killed
 * (its replica takes over after cluster-node-timeout) and then the NATS node leading the usage
 * stream. Afterwards the money adds up as in faults.e2e.test.ts: what callers were told they
 * spent == budget spent == metering's analytics, token and request counts exact, no hold left.
 * What callers saw during each failover is printed (docs/runbooks/README.md, "Redis Cluster or
 * NATS node failover").
 */
describe("Redis Cluster and NATS cluster: a master and a stream leader fail under traffic", () => {
  const namespace = uniqueNamespace("cluster");
  const prefix = `tollgate:${namespace}:`;
  const BUDGET = 10n ** 15n;
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
      routers: 2,
      upstreamPort: upstream.port,
      externalUpstream: true,
      serviceEnv: { NATS_STREAM_REPLICAS: "3" },
    });
    peek = connectRedis(redisCluster.url, "cluster-e2e");
    peek.on("error", () => {});
    nc = await connect({
      servers: natsCluster.url.split(","),
      maxReconnectAttempts: -1,
      reconnectTimeWait: 250,
    });
  }, 60_000);

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

  /** What one request came to, as its caller saw it. */
  interface Outcome {
    status: number;
    /** When it was sent, ms since the fault's start (negative: before it). */
    at: number;
    ms: number;
    streamed: boolean;
    cost: bigint;
    tokens: number;
    done: boolean;
    errorCode?: string;
    errorType?: string;
    requestIdInBody?: boolean;
    tail: string;
  }

  async function send(key: string, i: number, t0: () => number, stream: boolean): Promise<Outcome> {
    const started = performance.now();
    const at = Date.now() - t0();
    let res: Response;
    try {
      res = await fetch(`${stack.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: 4,
          stream,
          ...(stream ? { stream_options: { include_usage: true } } : {}),
          messages: [{ role: "user", content: `cluster ${i}` }],
        }),
        signal: AbortSignal.timeout(15_000),
      });
    } catch (err) {
      throw new Error(`request ${i} got no answer: ${(err as Error).message}`);
    }
    const text = await res.text();
    const out: Outcome = {
      status: res.status,
      at,
      ms: performance.now() - started,
      streamed: stream,
      cost: 0n,
      tokens: 0,
      done: false,
      tail: text.slice(-400),
    };
    const readError = (json: { error?: { code?: string; type?: string; request_id?: string } }) => {
      out.errorCode = json.error?.code;
      out.errorType = json.error?.type;
      out.requestIdInBody = json.error?.request_id === res.headers.get("x-request-id");
    };
    if (res.status !== 200 || !stream) {
      const json = JSON.parse(text);
      if (res.status !== 200) readError(json);
      else {
        out.cost = BigInt(res.headers.get("x-tollgate-cost") ?? "0");
        out.tokens = json.usage.completion_tokens;
      }
      return out;
    }
    for (const line of text.split("\n")) {
      if (!line.startsWith("data: ")) continue;
      const data = line.slice(6);
      if (data === "[DONE]") {
        out.done = true;
        continue;
      }
      const json = JSON.parse(data);
      if (json.error) readError(json);
      else if (json.choices?.length === 0 && json.usage) out.cost = BigInt(json.x_tollgate?.cost ?? "0");
      else if (json.choices?.[0]?.delta?.content) out.tokens++;
    }
    return out;
  }

  /** `clients` concurrent callers sending requests one after another until `stop` resolves. */
  async function load(clients: number, stop: Promise<void>, request: (n: number) => Promise<Outcome>) {
    let stopped = false;
    void stop.then(() => {
      stopped = true;
    });
    let n = 0;
    const outcomes: Outcome[] = [];
    await Promise.all(
      Array.from({ length: clients }, async () => {
        while (!stopped) outcomes.push(await request(n++));
      }),
    );
    return outcomes;
  }

  interface Books {
    requests: number;
    outputTokens: number;
    cost: bigint;
    spent: bigint;
    held: bigint;
  }

  /** Metering's analytics, and the budget's spent and held read from every master. */
  async function books(accountId: string): Promise<Books> {
    const res = await fetch(`${stack.adminUrls[0]}/admin/v1/usage?account=${accountId}`, {
      headers: { authorization: `Bearer ${stack.adminToken}` },
    });
    expect(res.status).toBe(200);
    const { totals } = (await res.json()) as {
      totals: { requests: number; output_tokens: number; cost: string };
    };
    let spent = 0n;
    let held = 0n;
    const keys: string[] = [];
    for await (const batch of scanStream(peek, { match: `${prefix}auth:budget:{${accountId}}:connection:*` }))
      keys.push(...batch);
    for (const key of keys.filter((k) => !k.endsWith(":holds"))) {
      const [s, h] = await peek.hmget(key, "spent", "held");
      spent += BigInt(s ?? "0");
      held += BigInt(h ?? "0");
    }
    return {
      requests: Number(totals.requests),
      outputTokens: Number(totals.output_tokens),
      cost: BigInt(totals.cost),
      spent,
      held,
    };
  }

  async function settledBooks(accountId: string, requests: number): Promise<Books> {
    const deadline = Date.now() + 25_000;
    for (;;) {
      const b = await books(accountId).catch(() => undefined);
      if (b && ((b.requests >= requests && b.held === 0n) || Date.now() > deadline)) return b;
      if (!b && Date.now() > deadline) return books(accountId);
      await new Promise((r) => setTimeout(r, 250));
    }
  }

  /** Outcomes by status, error and speed, for the test output and failure messages. */
  function summary(outcomes: Outcome[]): Record<string, number> {
    const counts: Record<string, number> = {};
    for (const o of outcomes) {
      const speed = o.ms < 1_000 ? "<1s" : o.ms < 5_000 ? "1-5s" : ">5s";
      const k = o.status === 200 ? `200 ${speed}` : `${o.status} ${o.errorType}/${o.errorCode} ${speed}`;
      counts[k] = (counts[k] ?? 0) + 1;
    }
    return counts;
  }

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

  it("fails over the Redis master of an account's slot under traffic: fast 503s meanwhile, nothing lost or counted twice", async () => {
    const accountId = "redis-failover";
    const key = await account(accountId);
    const victim = await redisCluster.masterOf(`{${accountId}}`);
    const others = {
      keyStoreOnVictim: (await redisCluster.masterOf("{keys}")) === victim,
      usageOnVictim: (await redisCluster.masterOf("{usage}")) === victim,
    };
    let t0 = 0;
    let failoverMs = 0;
    const fault = (async () => {
      await new Promise((r) => setTimeout(r, 1_000));
      t0 = Date.now();
      await redisCluster.kill(victim);
      failoverMs = await redisCluster.waitForFailover(victim, t0);
      await new Promise((r) => setTimeout(r, 2_000));
    })();
    const outcomes = await load(4, fault, (n) => send(key, n, () => t0 || Date.now(), n % 3 === 0));
    report("redis master killed", outcomes, { failoverMs, ...others });

    const served = outcomes.filter((o) => o.status === 200);
    const failed = outcomes.filter((o) => o.status !== 200);
    expect(outcomes.length).toBeGreaterThan(20);
    // Callers of the failed slot got the retryable 503 with the request id, fast.
    for (const o of failed) {
      expect(o.status, o.tail).toBe(503);
      expect(o.errorType).toBe("server_error");
      expect(o.requestIdInBody).toBe(true);
      expect(o.ms).toBeLessThan(3_000);
    }
    // After the failover the account is served again.
    expect(served.some((o) => o.at > failoverMs)).toBe(true);
    for (const o of served) {
      if (o.streamed) expect(o.done).toBe(true);
      expect(o.tokens).toBe(4);
      expect(o.cost).toBeGreaterThan(0n);
    }
    const told = served.reduce((sum, o) => sum + o.cost, 0n);
    const b = await settledBooks(accountId, served.length);
    expect(b.requests).toBe(served.length);
    expect(b.outputTokens).toBe(served.length * 4);
    expect(b.cost).toBe(told);
    expect(b.spent).toBe(told);
    expect(b.held).toBe(0n);
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
    const b = await settledBooks(accountId, outcomes.length);
    expect(b.requests).toBe(outcomes.length);
    expect(b.outputTokens).toBe(outcomes.length * 4);
    expect(b.cost).toBe(told);
    expect(b.spent).toBe(told);
    expect(b.held).toBe(0n);
  }, 60_000);
});
