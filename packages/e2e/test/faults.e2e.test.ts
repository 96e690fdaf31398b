import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import {
  type NatsFixture,
  privateNats,
  privateRedis,
  type RedisFixture,
  uniqueNamespace,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminCreate } from "./gateways.js";
import * as traffic from "./traffic.js";
import { isFastRetryable503, load, summary } from "./traffic.js";

/**
 * Faults survived with nothing lost (docs/money.md, "Records"): one multi-process stack with two routers on a
 * private NATS (file-backed JetStream) and a private append-only Redis, both restartable.
 * Each fault is injected under a few concurrent clients; afterwards the money adds up: what
 * callers were told they spent == budget spent == metering's analytics, token and request
 * counts are exact, and no budget hold is left behind.
 */
describe("faults under traffic: Redis and NATS restarts, a router killed mid-stream", () => {
  const namespace = uniqueNamespace("faults");
  const prefix = `tollgate:${namespace}:`;
  const BUDGET = 10n ** 15n;
  let nats: NatsFixture;
  let redis: RedisFixture;
  let upstream: FakeUpstream;
  let stack: Stack;
  let peek: Redis;

  beforeAll(async () => {
    [nats, redis, upstream] = await Promise.all([
      privateNats(),
      privateRedis({ appendOnly: true }),
      // In process, so the test reads what the upstream wrote on each stream (tokensWritten).
      startFakeUpstream({ tokensPerSecond: 100, outputTokens: 1_000, record: true }),
    ]);
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 2,
      upstreamPort: upstream.port,
      externalUpstream: true,
    });
    peek = connectRedis(redis.url);
    // The test's own connection sees the outage too; its commands run only once Redis is back.
    peek.on("error", () => {});
  }, 60_000);

  afterAll(async () => {
    if (peek) await quitRedis(peek);
    await stack?.stop();
    await upstream?.close();
    await nats?.stop();
    await redis?.stop();
  });

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
  const send = (key: string, i: number, opts: traffic.ChatOptions) =>
    traffic.sendChat(stack.url, key, i, opts);
  const settledBooks = (accountId: string, requests: number) =>
    traffic.settledBooks(ledgers(), accountId, requests);

  it("restarts Redis (append-only) under traffic: outage requests fail fast with 503, nothing is lost or counted twice", async () => {
    const key = await account("redis-fault");
    // A response stored under an Idempotency-Key before the outage replays after it, uncharged.
    const first = await send(key, -1, { stream: false, maxTokens: 3, idempotencyKey: "before-outage" });
    expect(first.status).toBe(200);

    const restart = (async () => {
      await new Promise((r) => setTimeout(r, 700));
      await redis.restart({ downMs: 1_500 });
      await new Promise((r) => setTimeout(r, 1_500));
    })();
    const outcomes = await load(4, restart, (n) =>
      send(key, n, {
        stream: n % 3 === 0,
        maxTokens: 4,
        // Streams cannot carry an Idempotency-Key (they are not replayable).
        ...(n % 3 !== 0 && n % 5 === 1 ? { idempotencyKey: `k-${n}` } : {}),
      }),
    );
    const replay = await send(key, -1, { stream: false, maxTokens: 3, idempotencyKey: "before-outage" });
    expect(replay.status).toBe(200);
    expect(replay.cost).toBe(first.cost);

    const served = [first, ...outcomes.filter((o) => o.status === 200)];
    const failed = outcomes.filter((o) => o.status !== 200);
    expect(outcomes.length).toBeGreaterThan(20);
    expect(failed.length).toBeGreaterThan(0);
    expect(summary(failed)).toEqual(summary(failed.filter(isFastRetryable503)));
    for (const o of served) {
      if (o.streamed) expect(o.done).toBe(true);
      expect(o.tokens).toBe(o === first ? 3 : 4);
      expect(o.cost).toBeGreaterThan(0n);
    }

    const servedCost = served.reduce((sum, o) => sum + o.cost, 0n);
    const b = await settledBooks("redis-fault", served.length);
    expect(b.requests).toBe(served.length);
    expect(b.outputTokens).toBe(served.reduce((sum, o) => sum + o.tokens, 0));
    expect(b.cost).toBe(servedCost);
    expect(b.spent).toBe(servedCost);
    expect(b.held).toBe(0n);
  }, 45_000);
  it("restarts NATS under traffic: every served request is billed once, none lost", async () => {
    const key = await account("nats-fault");
    const restart = (async () => {
      await new Promise((r) => setTimeout(r, 700));
      await nats.restart({ downMs: 1_500 });
      await new Promise((r) => setTimeout(r, 1_500));
    })();
    const outcomes = await load(4, restart, (n) => send(key, n, { stream: n % 2 === 0, maxTokens: 4 }));

    // Publishing rides out the restart (retried with the same message id until its deadline),
    // so every caller is served; the slow ones waited for NATS to come back.
    expect(outcomes.length).toBeGreaterThan(8);
    expect(summary(outcomes.filter((o) => o.status !== 200))).toEqual({});
    expect(outcomes.some((o) => o.ms > 1_000)).toBe(true);
    for (const o of outcomes) {
      if (o.streamed) expect(o.done).toBe(true);
      expect(o.tokens).toBe(4);
      expect(o.cost).toBeGreaterThan(0n);
    }
    const servedCost = outcomes.reduce((sum, o) => sum + o.cost, 0n);
    const b = await settledBooks("nats-fault", outcomes.length);
    expect(b.requests).toBe(outcomes.length);
    expect(b.outputTokens).toBe(outcomes.length * 4);
    expect(b.cost).toBe(servedCost);
    expect(b.spent).toBe(servedCost);
    expect(b.held).toBe(0n);
  }, 45_000);
  it("kills a router (SIGKILL) mid-stream: callers get a clean end and are told exactly what was relayed and billed", async () => {
    const key = await account("router-fault");
    const MAX = 30;
    // Streams of about 1.5 s, so several are in flight on each router when one dies.
    upstream.configure({ tokensPerSecond: 20 });
    const seen = upstream.requests.length;
    const router = stack.processes.find((p) => p.name === "inference-router-1")!;
    const kill = (async () => {
      await new Promise((r) => setTimeout(r, 800));
      router.child.kill("SIGKILL");
      await new Promise((r) => setTimeout(r, 2_500));
    })();
    const outcomes = await load(6, kill, (n) => send(key, n, { stream: true, maxTokens: MAX }));
    upstream.configure({ tokensPerSecond: 100 });

    const streamed = outcomes.filter((o) => o.status === 200);
    const completed = streamed.filter((o) => o.done);
    const cut = streamed.filter((o) => !o.done);
    // A call refused before its first chunk is a plain retryable JSON error.
    expect(summary(outcomes.filter((o) => o.status !== 200 && !isFastRetryable503(o)))).toEqual({});
    for (const o of completed) expect(o.tokens, o.tail).toBe(MAX);
    // A stream cut short ends with the spec's error event (no [DONE]), never by hanging, and
    // tells what it is billed for what was relayed, as a finished stream does (docs/money.md,
    // "Records"): `x_tollgate` on that event and the `x-tollgate-cost` trailer, one figure.
    expect(cut.length).toBeGreaterThan(0);
    for (const o of cut) {
      expect(o.errorType).toBe("server_error");
      expect(o.tokens).toBeLessThan(MAX);
      expect(o.cost, o.tail).toBeGreaterThan(0n);
    }
    for (const o of streamed) expect(o.trailerCost, o.tail).toBe(o.cost);

    const relayed = streamed.reduce((sum, o) => sum + o.tokens, 0);
    const written = upstream.requests.slice(seen).reduce((sum, r) => sum + (r.tokensWritten ?? 0), 0);
    const b = await settledBooks("router-fault", streamed.length);
    expect(b.requests).toBe(streamed.length);
    // Billed: exactly the tokens relayed to callers (the upstream may have written a few more
    // that died with the router and reached nobody).
    expect(b.outputTokens).toBe(relayed);
    expect(written).toBeGreaterThanOrEqual(relayed);
    // What callers were told == budget spent == metering's analytics, the cut streams included.
    const told = streamed.reduce((sum, o) => sum + o.cost, 0n);
    expect(b.spent).toBe(told);
    expect(b.cost).toBe(told);
    expect(b.held).toBe(0n);
    // api-edge recorded the cut streams itself (the killed router could not).
    expect(stack.output()).toContain("usage of a stream lost mid-way recorded");
  }, 45_000);
  it("keeps NATS down: a buffered answer fails after 15 s, a stream after 15 s and api-edge's 5 s RecordUsage try", async () => {
    const key = await account("nats-down");
    let up: () => void = () => {};
    const back = nats.restart({ until: new Promise<void>((resolve) => (up = resolve)) });
    try {
      // Down before the requests: each one's usage is published into the outage.
      await new Promise((r) => setTimeout(r, 500));
      const [buffered, streamed] = await Promise.all([
        send(key, 0, { stream: false, maxTokens: 4, timeoutMs: 40_000 }),
        send(key, 1, { stream: true, maxTokens: 4, timeoutMs: 40_000 }),
      ]);
      // The router's 15 s (PUBLISH_DEADLINE_MS), then the 503: the buffered answer is withheld.
      expect(buffered.status).toBe(503);
      expect(buffered.errorCode).toBe("usage_not_recorded");
      expect(buffered.ms).toBeGreaterThan(14_500);
      expect(buffered.ms).toBeLessThan(17_500);
      // A stream's chunks were relayed: api-edge tries metering's RecordUsage (at most 5 s,
      // RECORD_USAGE_TIMEOUT_MS), which cannot store it either, and then ends the stream with the
      // error event, telling no cost (docs/operations.md, "NATS restarted").
      expect(streamed.status).toBe(200);
      expect(streamed.done).toBe(false);
      expect(streamed.errorCode).toBe("usage_not_recorded");
      expect(streamed.cost).toBe(0n);
      expect(streamed.ms).toBeGreaterThan(19_500);
      expect(streamed.ms).toBeLessThan(22_500);
      expect(stack.output()).toContain("usage of a stream lost mid-way not recorded");
    } finally {
      up();
      await back;
    }
  }, 60_000);
});
