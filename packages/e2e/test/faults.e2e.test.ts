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

  /** What one request came to, as its caller saw it. */
  interface Outcome {
    status: number;
    ms: number;
    streamed: boolean;
    /** Cost the caller was told (header, or the usage chunk of a stream); 0n when none. */
    cost: bigint;
    /** Content chunks relayed to the caller (streams), or completion tokens (buffered). */
    tokens: number;
    /** A stream ended with `data: [DONE]`. */
    done: boolean;
    /** The error body's code (a JSON error, or a stream's final error event). */
    errorCode?: string;
    errorType?: string;
    retryAfter?: string | null;
    requestIdInBody?: boolean;
    /** The end of the body, for failure messages. */
    tail: string;
  }

  async function send(
    key: string,
    i: number,
    opts: { stream: boolean; maxTokens: number; idempotencyKey?: string },
  ): Promise<Outcome> {
    const started = performance.now();
    const headers: Record<string, string> = {
      authorization: `Bearer ${key}`,
      "content-type": "application/json",
    };
    if (opts.idempotencyKey) headers["idempotency-key"] = opts.idempotencyKey;
    let res: Response;
    try {
      res = await fetch(`${stack.url}/v1/chat/completions`, {
        method: "POST",
        headers,
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: opts.maxTokens,
          stream: opts.stream,
          ...(opts.stream ? { stream_options: { include_usage: true } } : {}),
          messages: [{ role: "user", content: `fault ${i}` }],
        }),
        signal: AbortSignal.timeout(15_000),
      });
    } catch (err) {
      throw new Error(`request ${i} got no answer: ${(err as Error).message}`);
    }
    const text = await res.text();
    const ms = performance.now() - started;
    const out: Outcome = {
      status: res.status,
      ms,
      streamed: opts.stream,
      cost: 0n,
      tokens: 0,
      done: false,
      retryAfter: res.headers.get("retry-after"),
      tail: text.slice(-400),
    };
    const readError = (json: { error?: { code?: string; type?: string; request_id?: string } }) => {
      out.errorCode = json.error?.code;
      out.errorType = json.error?.type;
      out.requestIdInBody = json.error?.request_id === res.headers.get("x-request-id");
    };
    if (res.status !== 200 || !opts.stream) {
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
  async function load(
    clients: number,
    stop: Promise<void>,
    request: (n: number) => Promise<Outcome>,
  ): Promise<Outcome[]> {
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

  /** Metering's analytics and the budget's spent and held, straight from Redis. */
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
    const keys = await peek.keys(`${prefix}auth:budget:{${accountId}}:connection:*`);
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

  /** Waits until the books show `requests` applied and no hold left, then returns them. */
  async function settledBooks(accountId: string, requests: number): Promise<Books> {
    let b = await books(accountId);
    const deadline = Date.now() + 20_000;
    while ((b.requests < requests || b.held !== 0n) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
      b = await books(accountId);
    }
    return b;
  }

  /** The spec's 5xx error body: a retryable 503 with the request id, answered fast. */
  function isFastRetryable503(o: Outcome): boolean {
    return o.status === 503 && o.errorType === "server_error" && o.requestIdInBody === true && o.ms < 1_000;
  }

  /** Outcomes by status, code and speed, so a failed comparison shows what happened. */
  function summary(outcomes: Outcome[]): Record<string, number> {
    const counts: Record<string, number> = {};
    for (const o of outcomes) {
      const k = `${o.status} ${o.errorType}/${o.errorCode} ${o.ms < 1_000 ? "fast" : `slow`} id:${o.requestIdInBody}`;
      counts[k] = (counts[k] ?? 0) + 1;
    }
    return counts;
  }

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
  it("kills a router (SIGKILL) mid-stream: callers get a clean end, what was relayed is billed exactly once", async () => {
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
    // A stream cut short ends with the spec's error event (no [DONE]), never by hanging.
    expect(cut.length).toBeGreaterThan(0);
    for (const o of cut) {
      expect(o.errorType).toBe("server_error");
      expect(o.tokens).toBeLessThan(MAX);
    }

    const relayed = streamed.reduce((sum, o) => sum + o.tokens, 0);
    const written = upstream.requests.slice(seen).reduce((sum, r) => sum + (r.tokensWritten ?? 0), 0);
    const b = await settledBooks("router-fault", streamed.length);
    expect(b.requests).toBe(streamed.length);
    // Billed: exactly the tokens relayed to callers (the upstream may have written a few more
    // that died with the router and reached nobody).
    expect(b.outputTokens).toBe(relayed);
    expect(written).toBeGreaterThanOrEqual(relayed);
    expect(b.spent).toBe(b.cost);
    // Completed streams cost what their callers were told; the cut ones were billed on top.
    expect(b.cost).toBeGreaterThan(completed.reduce((sum, o) => sum + o.cost, 0n));
    expect(b.held).toBe(0n);
    // api-edge recorded the cut streams itself (the killed router could not).
    expect(stack.output()).toContain("usage of a stream lost mid-way recorded");
  }, 45_000);
});
