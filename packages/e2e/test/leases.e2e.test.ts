import { connectRedis, quitRedis, type Redis } from "@tollgate/kit/redis";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminCreate } from "./gateways.js";
import * as traffic from "./traffic.js";
import { type Outcome, sendChat, summary } from "./traffic.js";

/**
 * Leases (docs/money.md, "Leases"): two api-edge replicas admit account-door requests on
 * allowances auth-policy leased them, sharing one budget. The money still adds up (told ==
 * committed == metered, never over budget, no hold left once the leases went back), a revoked
 * key is refused on both edges within a second, the last part of a budget is still admitted
 * request by request, and a request costs auth-policy far less than one call.
 */
describe("leases: two api-edge replicas sharing one budget", () => {
  const namespace = uniqueNamespace("leases");
  const prefix = `tollgate:${namespace}:`;
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  let peek: Redis;
  let upstream: FakeUpstream;

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    // In process, so a test can slow its streams down.
    upstream = await startFakeUpstream({ tokensPerSecond: 1_000 });
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 1,
      edges: 2,
      upstreamPort: upstream.port,
      externalUpstream: true,
    });
    peek = connectRedis(redis.url);
  }, 60_000);

  afterAll(async () => {
    if (peek) await quitRedis(peek);
    await stack?.stop();
    await upstream?.close();
    await nats?.stop();
    await redis?.stop();
  });

  const admin = (path: string, body: unknown) => adminCreate(stack, path, body);

  /** A fresh account with one connection (a budget when given); returns its key and key id. */
  async function account(id: string, budget?: bigint): Promise<{ key: string; keyId: string }> {
    await admin("/admin/v1/accounts", { id });
    await admin(`/admin/v1/accounts/${id}/connections`, {
      id: `${id}-conn`,
      models: ["tollgate-mini"],
      ...(budget !== undefined ? { budget: { amount: budget.toString() } } : {}),
    });
    const created = (await admin(`/admin/v1/accounts/${id}/connections/${id}-conn/keys`, {})) as {
      secret: string;
      key: { id: string };
    };
    return { key: created.secret, keyId: created.key.id };
  }

  const ledgers = (): traffic.Ledgers => ({
    adminUrl: stack.adminUrls[0]!,
    adminToken: stack.adminToken,
    peek,
    prefix,
  });

  /** The account-door calls auth-policy answered so far (metering's settlements excluded). */
  async function edgeCalls(): Promise<number> {
    const text = await (await fetch(stack.metricsUrls["auth-policy"]!)).text();
    let n = 0;
    for (const m of text.matchAll(/^tollgate_auth_calls_total\{([^}]*)\} (\S+)$/gm)) {
      if (/method="(authorize|acquireLease|returnLease|settleReservation)"/.test(m[1]!)) n += Number(m[2]);
    }
    return n;
  }

  /** `total` requests from `clients` concurrent callers over both edges; each caller stops at its first 402. */
  async function drive(key: string, total: number, clients: number, maxTokens = 8): Promise<Outcome[]> {
    const out: Outcome[] = [];
    let next = 0;
    await Promise.all(
      Array.from({ length: clients }, async (_, c) => {
        while (next < total) {
          const i = next++;
          const o = await sendChat(stack.urls[c % 2]!, key, i, { stream: i % 4 === 3, maxTokens });
          out.push(o);
          if (o.status === 402) return;
        }
      }),
    );
    return out;
  }

  it("serves concurrent load on both edges with far fewer than one auth-policy call per request, billing exactly once", async () => {
    const { key } = await account("lease-load", 10n ** 12n);
    const before = await edgeCalls();
    const outcomes = await drive(key, 160, 8);
    expect(
      outcomes.filter((o) => o.status !== 200),
      JSON.stringify(summary(outcomes)),
    ).toEqual([]);
    const perRequest = ((await edgeCalls()) - before) / outcomes.length;
    // One Authorize and one SettleReservation per request before leases; now a lease call now and then.
    expect(perRequest).toBeLessThan(0.5);

    const told = outcomes.reduce((sum, o) => sum + o.cost, 0n);
    const b = await traffic.settledBooks(ledgers(), "lease-load", outcomes.length);
    expect(b.requests).toBe(outcomes.length);
    expect(b.cost).toBe(told);
    expect(b.spent).toBe(told);
    // Every lease went back within a few seconds of the last request.
    expect(b.held).toBe(0n);
    expect(b.waitedMs).toBeLessThan(10_000);
  }, 60_000);

  it("keeps a lease for a caller that pauses between requests: no auth-policy call on the path after each pause", async () => {
    const { key } = await account("lease-pause", 10n ** 12n);
    const first = await sendChat(stack.urls[0]!, key, 0, { stream: false, maxTokens: 8 });
    expect(first.status).toBe(200);
    const before = await edgeCalls();
    const outcomes = [first];
    // Six requests 250 ms apart: about 1.5 s, so the lease's 1 s of use ends once on the way.
    for (let i = 1; i <= 6; i++) {
      await new Promise((r) => setTimeout(r, 250));
      outcomes.push(await sendChat(stack.urls[0]!, key, i, { stream: false, maxTokens: 8 }));
    }
    expect(outcomes.map((o) => o.status)).toEqual(Array(7).fill(200));
    // A lease returned after each pause would cost a ReturnLease and an AcquireLease per request
    // (12); kept, it is one return and one acquisition when its second is up, at most twice.
    expect((await edgeCalls()) - before).toBeLessThanOrEqual(4);

    const told = outcomes.reduce((sum, o) => sum + o.cost, 0n);
    const b = await traffic.settledBooks(ledgers(), "lease-pause", outcomes.length);
    expect(b.requests).toBe(outcomes.length);
    expect(b.spent).toBe(told);
    expect(b.held).toBe(0n);
  }, 60_000);

  it("admits the last requests of a budget one by one until it is truly spent, never beyond, then 402 as before", async () => {
    const BUDGET = 800n;
    const { key } = await account("lease-end", BUDGET);
    const driven = await drive(key, 400, 6);
    // A concurrent caller's 402 may come from the holds of the others in flight or another
    // edge's lease (docs/money.md, "Leases"), which later settle below their quotes; once every
    // hold is gone, one caller alone takes what is left, request by request, until it is truly
    // spent.
    const drivenServed = driven.filter((o) => o.status === 200).length;
    expect((await traffic.settledBooks(ledgers(), "lease-end", drivenServed)).held).toBe(0n);
    const outcomes = [...driven];
    for (let i = 0; i < 20; i++) {
      const o = await sendChat(stack.urls[0]!, key, 1_000 + i, { stream: false, maxTokens: 8 });
      outcomes.push(o);
      if (o.status !== 200) break;
    }
    expect(outcomes.at(-1)?.status).toBe(402);
    const served = outcomes.filter((o) => o.status === 200);
    const refused = outcomes.filter((o) => o.status !== 200);
    expect(refused.length).toBeGreaterThan(0);
    for (const o of refused) {
      expect(o.status).toBe(402);
      expect(o.errorCode).toBe("budget_exceeded");
    }
    const told = served.reduce((sum, o) => sum + o.cost, 0n);
    expect(told).toBeLessThanOrEqual(BUDGET);
    const b = await traffic.settledBooks(ledgers(), "lease-end", served.length);
    expect(b.requests).toBe(served.length);
    expect(b.cost).toBe(told);
    expect(b.spent).toBe(told);
    expect(b.held).toBe(0n);
    // Truly spent: what is left does not cover one more request's quote (a request's cost is
    // below its quote, so the largest cost served bounds the quote from below).
    const quote = await fetch(`${stack.urls[0]}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "tollgate-mini",
        max_tokens: 8,
        messages: [{ role: "user", content: "traffic 1" }],
      }),
    });
    expect(quote.status).toBe(402);
    const { error } = (await quote.json()) as { error: { code: string; message: string } };
    expect(error.code).toBe("budget_exceeded");
    const [, q, left] = /quote of (\d+) base units .*: (\d+) of \d+ left/.exec(error.message) ?? [];
    expect(BigInt(left!)).toBe(BUDGET - told);
    expect(BigInt(left!)).toBeLessThan(BigInt(q!));
  }, 60_000);

  it("refuses a revoked key on both edges within a second, though both held leases for it, and at once on the edge that revoked it", async () => {
    const { key, keyId } = await account("lease-revoke");
    let revokedAt = 0;
    let stop = false;
    const seen: Array<{ edge: number; sentAt: number; status: number; code?: string }> = [];
    const callers = [0, 1, 0, 1].map(async (edge, c) => {
      for (let i = 0; !stop; i++) {
        const sentAt = Date.now();
        const o = await sendChat(stack.urls[edge]!, key, c * 10_000 + i, { stream: false, maxTokens: 4 });
        seen.push({ edge, sentAt, status: o.status, ...(o.errorCode ? { code: o.errorCode } : {}) });
      }
    });
    await new Promise((r) => setTimeout(r, 600));
    const res = await fetch(`${stack.adminUrls[0]}/admin/v1/keys/${keyId}/revoke`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.adminToken}` },
    });
    expect(res.status).toBe(200);
    revokedAt = Date.now();
    await new Promise((r) => setTimeout(r, 1_600));
    stop = true;
    await Promise.all(callers);

    const before = seen.filter((s) => s.sentAt < revokedAt - 100);
    expect(before.length).toBeGreaterThan(0);
    expect(before.every((s) => s.status === 200)).toBe(true);
    // Every request sent a second after the revocation was refused, on each edge, as before leases.
    const late = seen.filter((s) => s.sentAt >= revokedAt + 1_000);
    for (const edge of [0, 1]) expect(late.filter((s) => s.edge === edge).length).toBeGreaterThan(0);
    for (const s of late) expect(s).toMatchObject({ status: 401, code: "revoked_api_key" });
    // The edge whose admin API revoked the key stopped its leases of it at once: it refused the
    // key well inside that second (100 ms left for the broadcast to reach every auth-policy).
    const revoker = seen.filter(
      (s) => s.edge === 0 && s.sentAt >= revokedAt + 100 && s.sentAt < revokedAt + 1_000,
    );
    expect(revoker.length).toBeGreaterThan(0);
    for (const s of revoker) expect(s).toMatchObject({ status: 401, code: "revoked_api_key" });
  }, 30_000);

  it("leaves no hold behind a buffered request its caller cut before the answer: settled at zero, not held until the TTL", async () => {
    const { key } = await account("lease-cut", 10n ** 9n);
    upstream.configure({ latencyMs: 2_000 });
    try {
      // Buffered answers of 2 s, each cut by its caller after 300 ms, on both edges.
      await Promise.all(
        [0, 1].map(async (edge) => {
          const res = await fetch(`${stack.urls[edge]}/v1/chat/completions`, {
            method: "POST",
            headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
            body: JSON.stringify({
              model: "tollgate-mini",
              max_tokens: 40,
              messages: [{ role: "user", content: "cut me" }],
            }),
            signal: AbortSignal.timeout(300),
          }).catch((err: Error) => err);
          expect(res).toBeInstanceOf(Error);
        }),
      );
    } finally {
      upstream.configure({ latencyMs: 0 });
    }
    const b = await traffic.settledBooks(ledgers(), "lease-cut", 0, 15_000);
    expect(b.held).toBe(0n);
    expect(b.spent).toBe(b.cost);
  }, 60_000);

  it("loses no usage when an api-edge dies mid-request: the router publishes it and metering charges the lease", async () => {
    const { key } = await account("lease-dead", 10n ** 12n);
    upstream.configure({ tokensPerSecond: 20 });
    // Streams of about 2 s on the second edge, admitted on its lease, then the edge is killed.
    const streams = Array.from({ length: 4 }, (_, i) =>
      sendChat(stack.urls[1]!, key, i, { stream: true, maxTokens: 40 }).catch(() => undefined),
    );
    await new Promise((r) => setTimeout(r, 800));
    await stack.stopProcess("api-edge-2", "SIGKILL");
    await Promise.all(streams);
    upstream.configure({ tokensPerSecond: 1_000 });

    let b = await traffic.books(ledgers(), "lease-dead");
    for (let i = 0; i < 100 && b.requests < 4; i++) {
      await new Promise((r) => setTimeout(r, 200));
      b = await traffic.books(ledgers(), "lease-dead");
    }
    // Every request the dead edge admitted was metered and charged exactly once.
    expect(b.requests).toBe(4);
    expect(b.cost).toBeGreaterThan(0n);
    expect(b.spent).toBe(b.cost);
    await stack.startProcess("api-edge-2");
  }, 60_000);
});
