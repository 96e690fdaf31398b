import { createHash } from "node:crypto";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { type GatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { type Client, createClient, GrpcStatus, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import { checkGrpcHealth } from "@tollgate/kit/health";
import { createLogger } from "@tollgate/kit/log";
import { connectNats, drainNats, type NatsConnection } from "@tollgate/kit/nats";
import { connectRedis, quitRedis } from "@tollgate/kit/redis";
import {
  AuthService,
  BUDGET_DETAILS,
  BudgetPeriod,
  KeyState,
  RATE_LIMIT_DETAILS,
  Route,
  SettleOutcome,
} from "@tollgate/proto/auth";
import { natsNames } from "@tollgate/proto/subjects";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { deleteMatching, keysMatching } from "@tollgate/testkit/redis-keys";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type AuthPolicy, start } from "../../src/app.js";
import type { KeyRevocation } from "../../src/domain/ports.js";
import { subscribeRevocations } from "../../src/transport/nats/revocations.js";
import { chatAsk, PRICED_MODEL } from "./priced.js";

type AuthClient = Client<MethodsOf<typeof AuthService>>;

const log = createLogger({ service: "auth-policy", level: "silent" });
const DEV_KEY = "tg_dev_int_test_key_0123456789abcdef";
const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const pricing = { inputPerMillion: 1, outputPerMillion: 1 };
const GATEWAY: GatewayConfig = parseGatewayConfig({
  upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:1/v1" }],
  models: [
    { id: "mini", upstream: "u", upstreamModel: "a", runtime: "vllm", pricing },
    { id: "pro", upstream: "u", upstreamModel: "b", runtime: "vllm", pricing },
    PRICED_MODEL,
  ],
  accounts: [
    {
      id: "demo",
      connections: [
        { id: "default", models: ["mini"], defaultModel: "mini", keys: [{ id: "dev", secret: DEV_KEY }] },
      ],
    },
  ],
});

let nats: NatsFixture;
let redis: RedisFixture;
let nc: NatsConnection;
let ns: string;
const replicas: AuthPolicy[] = [];
let one: AuthClient;
let two: AuthClient;
const received: Array<{ at: number; revocation: KeyRevocation }> = [];

async function startReplica(): Promise<AuthPolicy> {
  const app = await start(
    {
      grpcHost: "127.0.0.1",
      grpcPort: 0,
      gateway: GATEWAY,
      redisUrl: redis.url,
      redisPrefix: `${ns}:`,
      natsUrl: nats.url,
      natsNamespace: ns,
      deadlineSweepMs: 100,
    },
    log,
  );
  replicas.push(app);
  return app;
}

beforeAll(async () => {
  [nats, redis] = await Promise.all([useNats(), useRedis()]);
  ns = uniqueNamespace("auth");
  nc = await connectNats(nats.url, "auth-policy-int-test");
  subscribeRevocations(nc, natsNames(ns).keyRevoked, (revocation) =>
    received.push({ at: Date.now(), revocation }),
  );
  await nc.flush();
  // Two replicas starting together import the same configuration into the same Redis.
  const [a, b] = await Promise.all([startReplica(), startReplica()]);
  one = createClient(AuthService, `127.0.0.1:${a.port}`);
  two = createClient(AuthService, `127.0.0.1:${b.port}`);
  await Promise.all([one.$ready(5_000), two.$ready(5_000)]);
});

afterAll(async () => {
  one?.$close();
  two?.$close();
  for (const app of replicas) await app.stop();
  const r = connectRedis(redis.url);
  await deleteMatching(r, `${ns}:*`);
  await quitRedis(r);
  await drainNats(nc);
  await Promise.all([nats.stop(), redis.stop()]);
});

/** The error a call failed with. */
async function failure(p: Promise<unknown>): Promise<RemoteError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RemoteError);
  return err as RemoteError;
}

/** A fresh account and connection (via the admin RPCs) and one key on it. */
async function setUp(
  client: AuthClient,
  limits: Parameters<AuthClient["createConnection"]>[0]["limits"] = {},
) {
  const accountId = uniqueNamespace("acct");
  await client.createAccount({ accountId });
  await client.createConnection({ accountId, connectionId: "main", models: ["mini", "pro"], limits });
  const created = await client.createKey({ accountId, connectionId: "main", name: "int" });
  return { accountId, secret: created.secret, keyId: created.key!.keyId };
}

const chat = (key: string) => ({ key, route: Route.CHAT_COMPLETIONS, model: "", maxOutputTokens: 16 });

describe("two auth-policy replicas on one Redis", () => {
  it("both serve the configured development key and report healthy", async () => {
    for (const c of [one, two]) expect((await c.authorize(chat(DEV_KEY))).principal?.keyId).toBe("dev");
    for (const app of replicas) expect(await checkGrpcHealth(`127.0.0.1:${app.port}`)).toBe("SERVING");
  });

  it("authorizes on one replica a key created on the other, and lists it without its secret", async () => {
    const { accountId, secret, keyId } = await setUp(one);
    expect(secret).toMatch(/^tg_[0-9A-Za-z]{40}$/);
    const a = await two.authorize(chat(secret));
    expect(a.principal).toMatchObject({ accountId, connectionId: "main", keyId });
    expect(a.model).toBe("mini");
    const listed = await two.listKeys({ accountId });
    expect(listed.keys).toHaveLength(1);
    expect(listed.keys[0]).toMatchObject({
      keyId,
      last4: secret.slice(-4),
      state: KeyState.ACTIVE,
      name: "int",
    });
    const wire = JSON.stringify(listed, (_, v) => (typeof v === "bigint" ? String(v) : v));
    expect(wire).not.toContain(secret.slice(3, -4));
    expect(wire).not.toContain(sha256(secret));
  });

  it("refuses the exact excess of a burst over a per-key limit split across both replicas", async () => {
    const { secret } = await setUp(one, { perKey: { requestsPerMinute: 5 } });
    const outcomes = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        (i % 2 === 0 ? one : two).authorize(chat(secret)).then(
          (res) => ({ ok: true as const, res }),
          (err: unknown) => ({ ok: false as const, err: err as RemoteError }),
        ),
      ),
    );
    const admitted = outcomes.filter((o) => o.ok);
    const refused = outcomes.flatMap((o) => (o.ok ? [] : [o.err]));
    expect(admitted).toHaveLength(5);
    expect(refused).toHaveLength(7);
    for (const err of refused) {
      expect(err).toMatchObject({ status: GrpcStatus.RESOURCE_EXHAUSTED, code: "rate_limited" });
      const retryAfter = Number(err.details[RATE_LIMIT_DETAILS.retryAfter]);
      expect(retryAfter).toBeGreaterThanOrEqual(1);
      expect(retryAfter).toBeLessThanOrEqual(61);
      expect(err.details).toMatchObject({
        [RATE_LIMIT_DETAILS.limit]: "5",
        [RATE_LIMIT_DETAILS.remaining]: "0",
        [RATE_LIMIT_DETAILS.scope]: "key",
        [RATE_LIMIT_DETAILS.unit]: "requests",
      });
      expect(Number(err.details[RATE_LIMIT_DETAILS.reset])).toBeGreaterThanOrEqual(retryAfter);
    }
    const remaining = admitted.map((o) => (o.ok ? o.res.rateLimit?.remaining : -1)).sort();
    expect(remaining).toEqual([0, 1, 2, 3, 4]);
  });

  it("refuses a route outside the connection's policy with PERMISSION_DENIED", async () => {
    const accountId = uniqueNamespace("acct");
    await two.createAccount({ accountId });
    await two.createConnection({
      accountId,
      connectionId: "chat-only",
      models: ["mini"],
      routes: [Route.CHAT_COMPLETIONS],
    });
    const { secret } = await two.createKey({ accountId, connectionId: "chat-only" });
    expect((await one.authorize(chat(secret))).model).toBe("mini");
    const err = await failure(one.authorize({ key: secret, route: Route.THINK }));
    expect(err).toMatchObject({ status: GrpcStatus.PERMISSION_DENIED, code: "route_not_allowed" });
  });

  it("revokes on one replica: it refuses at once, the other (which cached the key) within a second", async () => {
    const { secret, keyId } = await setUp(two);
    for (const c of [one, two]) await c.authorize(chat(secret));
    const started = Date.now();
    const res = await one.revokeKey({ keyId });
    expect(res.key?.state).toBe(KeyState.REVOKED);
    expect(await failure(one.authorize(chat(secret)))).toMatchObject({
      status: GrpcStatus.UNAUTHENTICATED,
      code: "revoked_api_key",
    });
    await expect
      .poll(() => failure(two.authorize(chat(secret))), { timeout: 1_000, interval: 5 })
      .toMatchObject({ status: GrpcStatus.UNAUTHENTICATED, code: "revoked_api_key" });
    expect(Date.now() - started).toBeLessThan(1_000);
    await expect
      .poll(() => received.find((r) => r.revocation.keyId === keyId), { timeout: 1_000, interval: 10 })
      .toBeDefined();
    const got = received.find((r) => r.revocation.keyId === keyId)!;
    expect(got.at - started).toBeLessThan(1_000);
    expect(got.revocation).toMatchObject({ keyHash: sha256(secret), reason: "revoked" });
  });

  it("rotates with a grace window: old and new work on both replicas, then only the new one", async () => {
    const { secret: oldSecret, keyId: oldId } = await setUp(one);
    const rotated = await two.rotateKey({ keyId: oldId, graceSeconds: 2 });
    const graceEnds =
      Number(rotated.oldKey!.graceEndsAt!.seconds) * 1_000 + rotated.oldKey!.graceEndsAt!.nanos / 1e6;
    expect(rotated.oldKey).toMatchObject({ state: KeyState.ROTATING, rotatedTo: rotated.newKey!.keyId });
    expect(rotated.newKey).toMatchObject({ rotatedFrom: oldId, state: KeyState.ACTIVE });
    for (const c of [one, two]) {
      const old = await c.authorize(chat(oldSecret));
      expect(old.principal?.keyId).toBe(oldId);
      expect(old.keyValidUntil).toEqual(rotated.oldKey!.graceEndsAt);
      expect((await c.authorize(chat(rotated.secret))).principal?.keyId).toBe(rotated.newKey!.keyId);
    }
    await sleep(graceEnds - Date.now() + 50);
    for (const c of [one, two]) {
      expect(await failure(c.authorize(chat(oldSecret)))).toMatchObject({
        status: GrpcStatus.UNAUTHENTICATED,
        code: "rotated_api_key",
      });
      expect((await c.authorize(chat(rotated.secret))).principal?.keyId).toBe(rotated.newKey!.keyId);
    }
    // The end of the grace is broadcast too, once, by one of the replicas.
    await expect
      .poll(() => received.filter((r) => r.revocation.keyId === oldId), { timeout: 1_000, interval: 20 })
      .toHaveLength(1);
    const [ended] = received.filter((r) => r.revocation.keyId === oldId);
    expect(ended?.revocation).toMatchObject({ keyHash: sha256(oldSecret), reason: "rotated" });
    expect(ended!.at - graceEnds).toBeLessThan(1_000);
    await sleep(300);
    expect(received.filter((r) => r.revocation.keyId === oldId)).toHaveLength(1);
    expect(await failure(one.rotateKey({ keyId: oldId }))).toMatchObject({
      status: GrpcStatus.FAILED_PRECONDITION,
      code: "key_not_active",
    });
  });

  it("answers admin mistakes with their status and code", async () => {
    const { accountId } = await setUp(one);
    const cases: Array<[() => Promise<unknown>, GrpcStatus, string]> = [
      [() => two.createAccount({ accountId }), GrpcStatus.ALREADY_EXISTS, "account_exists"],
      [
        () => two.createConnection({ accountId, connectionId: "main", models: ["mini"] }),
        GrpcStatus.ALREADY_EXISTS,
        "connection_exists",
      ],
      [
        () => two.createConnection({ accountId: "nobody-here", connectionId: "x", models: ["mini"] }),
        GrpcStatus.NOT_FOUND,
        "account_not_found",
      ],
      [
        () => two.createConnection({ accountId, connectionId: "x", models: ["gpt-nope"] }),
        GrpcStatus.INVALID_ARGUMENT,
        "invalid_argument",
      ],
      [
        () =>
          two.createConnection({
            accountId,
            connectionId: "x",
            models: ["mini"],
            routes: [Route.UNSPECIFIED],
          }),
        GrpcStatus.INVALID_ARGUMENT,
        "invalid_argument",
      ],
      [
        () => two.createKey({ accountId, connectionId: "nope" }),
        GrpcStatus.NOT_FOUND,
        "connection_not_found",
      ],
      [
        () =>
          two.createKey({
            accountId,
            connectionId: "main",
            expiresAt: timestampFromDate(new Date(Date.now() - 1_000)),
          }),
        GrpcStatus.INVALID_ARGUMENT,
        "invalid_argument",
      ],
      [() => two.revokeKey({ keyId: "key_nope" }), GrpcStatus.NOT_FOUND, "key_not_found"],
      [() => two.listKeys({ accountId: "nobody-here" }), GrpcStatus.NOT_FOUND, "account_not_found"],
    ];
    for (const [call, status, code] of cases) expect(await failure(call())).toMatchObject({ status, code });
  });

  it("honours a key's expiry on every replica", async () => {
    const { accountId } = await setUp(one);
    const expiresAt = new Date(Date.now() + 1_000);
    const { secret, key } = await one.createKey({
      accountId,
      connectionId: "main",
      expiresAt: timestampFromDate(expiresAt),
    });
    expect((await two.authorize(chat(secret))).principal?.keyId).toBe(key!.keyId);
    await sleep(expiresAt.getTime() - Date.now() + 50);
    expect(await failure(two.authorize(chat(secret)))).toMatchObject({ code: "expired_api_key" });
    await expect
      .poll(() => received.find((r) => r.revocation.keyId === key!.keyId)?.revocation.reason, {
        timeout: 1_000,
        interval: 20,
      })
      .toBe("expired");
  });
});

describe("budgets on two auth-policy replicas sharing one Redis", () => {
  it("admits exactly what fits of 200 concurrent requests, then settles each once to the exact spend", async () => {
    // Every request is quoted 200: 100 bytes + 8 × 1 message + 16 + 76 output tokens.
    const QUOTE = 200n;
    const FITS = 37;
    const BUDGET = QUOTE * BigInt(FITS) + QUOTE - 1n;
    const accountId = uniqueNamespace("acct");
    await one.createAccount({ accountId });
    const created = await two.createConnection({
      accountId,
      connectionId: "main",
      models: ["priced"],
      budget: { amount: BUDGET.toString() },
    });
    expect(created.connection?.budget).toMatchObject({
      amount: BUDGET.toString(),
      period: BudgetPeriod.MONTH,
    });
    const { secret } = await one.createKey({ accountId, connectionId: "main" });
    const ask = chatAsk(secret);

    const outcomes = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        (i % 2 === 0 ? one : two).authorize({ ...ask, requestId: `req_${i}` }).then(
          (res) => ({ ok: true as const, res }),
          (err: unknown) => ({ ok: false as const, err: err as RemoteError }),
        ),
      ),
    );
    const admitted = outcomes.flatMap((o) => (o.ok ? [o.res] : []));
    const refused = outcomes.flatMap((o) => (o.ok ? [] : [o.err]));
    expect(admitted).toHaveLength(FITS);
    expect(refused).toHaveLength(200 - FITS);
    for (const err of refused) {
      expect(err).toMatchObject({ status: GrpcStatus.FAILED_PRECONDITION, code: "budget_exceeded" });
      expect(err.details).toMatchObject({
        [BUDGET_DETAILS.remaining]: String(QUOTE - 1n),
        [BUDGET_DETAILS.limit]: BUDGET.toString(),
        [BUDGET_DETAILS.quote]: QUOTE.toString(),
        [BUDGET_DETAILS.scope]: "connection",
      });
      expect(Number(err.details[BUDGET_DETAILS.reset])).toBeGreaterThanOrEqual(1);
    }
    // Each admission saw the holds of every one before it: never more held than the budget.
    expect(admitted.every((a) => a.quote === QUOTE.toString())).toBe(true);
    const remaining = admitted
      .map((a) => BigInt(a.budgetRemaining))
      .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    expect(remaining).toEqual(Array.from({ length: FITS }, (_, k) => QUOTE - 1n + QUOTE * BigInt(k)));
    expect(new Set(admitted.map((a) => a.reservationId)).size).toBe(FITS);
    const models = () => one.authorize({ key: secret, route: Route.MODELS });
    const shown = await models();
    expect([shown.budgetRemaining, shown.reservationId, shown.quote]).toEqual([String(QUOTE - 1n), "", ""]);

    // Settle every reservation twice, concurrently, on both replicas, with costs at most the quote.
    const costs = admitted.map((_, i) => BigInt((i * 53) % 201));
    const settle = (i: number, via: AuthClient) =>
      via.settleReservation({
        reservationId: admitted[i]!.reservationId,
        actualCost: costs[i]!.toString(),
        eventId: `evt_${i}`,
      });
    const settlements = await Promise.all(admitted.flatMap((_, i) => [settle(i, one), settle(i, two)]));
    for (let i = 0; i < FITS; i++) {
      const pair = [settlements[2 * i]!.outcome, settlements[2 * i + 1]!.outcome].sort();
      expect(pair).toEqual([SettleOutcome.SETTLED, SettleOutcome.ALREADY_SETTLED].sort());
      expect(settlements[2 * i]!.settledCost).toBe(costs[i]!.toString());
    }
    const spent = costs.reduce((a, b) => a + b, 0n);
    expect((await models()).budgetRemaining).toBe((BUDGET - spent).toString());
    // And in Redis: one period hash for the connection, its spend the exact sum, nothing held.
    const r = connectRedis(redis.url);
    try {
      const keys = await keysMatching(r, `${ns}:auth:budget:{${accountId}}:*`);
      const hashes = keys.filter((k) => !k.endsWith(":holds"));
      expect(hashes).toHaveLength(1);
      expect(hashes[0]).toMatch(/:connection:main:month:\d{4}-\d{2}$/);
      expect(await r.hmget(hashes[0]!, "spent", "held")).toEqual([spent.toString(), "0"]);
    } finally {
      await quitRedis(r);
    }
    // A third settlement, even with another cost, changes nothing.
    const third = await two.settleReservation({
      reservationId: admitted[0]!.reservationId,
      actualCost: "1",
      eventId: "x",
    });
    expect(third).toMatchObject({
      outcome: SettleOutcome.ALREADY_SETTLED,
      settledCost: costs[0]!.toString(),
    });
    expect((await models()).budgetRemaining).toBe((BUDGET - spent).toString());
  });

  it("keeps a budget's period when asked to change it in place: its spend today still caps the next requests", async () => {
    // Every request is quoted 40 (10 bytes + 8 × 1 message + 16 + 6 output tokens) and costs 39.
    const COST = 39n;
    const accountId = uniqueNamespace("acct");
    await one.createAccount({ accountId });
    await two.createConnection({
      accountId,
      connectionId: "c2",
      models: ["priced"],
      budget: { amount: "300", period: BudgetPeriod.DAY },
    });
    const { secret } = await one.createKey({ accountId, connectionId: "c2" });
    const ask = { key: secret, route: Route.CHAT_COMPLETIONS, model: "", maxOutputTokens: 6, bodyBytes: 10 };
    let told = 0n;
    let n = 0;
    /** One request on either replica, settled at COST when admitted; the refusal's code otherwise. */
    const request = async (): Promise<string> => {
      const via = n++ % 2 === 0 ? one : two;
      const res = await via
        .authorize({ ...ask, messageCount: 1, requestId: `req_${n}` })
        .catch((e: unknown) => e);
      if (res instanceof RemoteError) return res.code ?? "?";
      const { reservationId, quote } = res as { reservationId: string; quote: string };
      expect(quote).toBe("40");
      await via.settleReservation({ reservationId, actualCost: COST.toString(), eventId: `evt_${n}` });
      told += COST;
      return "ok";
    };
    for (let i = 0; i < 6; i++) expect(await request()).toBe("ok");
    expect(told).toBe(234n);

    // The operator asks for 300 a month instead of 300 a day.
    const refused = await failure(
      two.updateConnection({
        accountId,
        connectionId: "c2",
        budget: { amount: "300", period: BudgetPeriod.MONTH },
      }),
    );
    expect(refused).toMatchObject({ status: GrpcStatus.FAILED_PRECONDITION, code: "budget_period_change" });
    const shown = (await one.getConnection({ accountId, connectionId: "c2" })).connection;
    expect(shown?.budget).toMatchObject({ amount: "300", period: BudgetPeriod.DAY });
    expect(shown?.budgetUsage).toMatchObject({ spent: "234", held: "0", remaining: "66" });

    // The next requests are served only while they fit: one more, then 402.
    const outcomes: string[] = [];
    for (let i = 0; i < 40; i++) outcomes.push(await request());
    expect(outcomes.filter((o) => o === "ok")).toHaveLength(1);
    expect(outcomes.slice(1).every((o) => o === "budget_exceeded")).toBe(true);
    // The books: what callers were told == budget spent, nothing held, never below zero.
    const after = (await two.getConnection({ accountId, connectionId: "c2" })).connection?.budgetUsage;
    expect(after).toMatchObject({ spent: told.toString(), held: "0" });
    expect(told).toBeLessThanOrEqual(300n);
    expect(BigInt(after!.remaining)).toBe(300n - told);
  });

  it("spends a rotated key's budget from one counter with its successor, per request and on leases", async () => {
    // A key's own budget of 1000 a day; every request is quoted 200 (chatAsk) and charged that.
    const accountId = uniqueNamespace("acct");
    await one.createAccount({ accountId });
    await one.createConnection({ accountId, connectionId: "main", models: ["priced"] });
    const old = await two.createKey({
      accountId,
      connectionId: "main",
      budget: { amount: "1000", period: BudgetPeriod.DAY },
    });
    let told = 0n;
    let n = 0;
    /** One request on `secret` via either replica, charged its quote; the refusal's code otherwise. */
    const request = async (secret: string): Promise<string> => {
      const via = n++ % 2 === 0 ? one : two;
      const res = await via.authorize(chatAsk(secret)).catch((e: unknown) => e);
      if (res instanceof RemoteError) return res.code ?? "?";
      const { reservationId, quote } = res as { reservationId: string; quote: string };
      const s = await via.settleReservation({ reservationId, actualCost: quote, eventId: `evt_rot_${n}` });
      told += BigInt(s.settledCost);
      return "ok";
    };
    for (let i = 0; i < 3; i++) expect(await request(old.secret)).toBe("ok");
    const rotated = await one.rotateKey({ keyId: old.key!.keyId, graceSeconds: 3_600 });
    const newId = rotated.newKey!.keyId;
    const usage = async (keyId: string) => (await two.getKey({ keyId })).key?.budgetUsage;
    // The successor shows the lineage's spend: the old key's 600 of today.
    expect(await usage(newId)).toMatchObject({ spent: "600", held: "0", remaining: "400" });

    // A lease to the new key takes half of the 400 left; one to the old key finds no room for a
    // request in half of what is left then, so the two never hold more than is left.
    const fresh = await two.acquireLease({ request: chatAsk(rotated.secret), requests: 8 });
    expect(fresh).toMatchObject({ granted: true, budget: "200" });
    const prior = await one.acquireLease({ request: chatAsk(old.secret), requests: 8 });
    expect(prior.granted).toBe(false);
    const ticket = await one.settleReservation({
      reservationId: `${fresh.leaseId}~1`,
      actualCost: "200",
      eventId: "evt_rot_lease_1",
    });
    told += BigInt(ticket.settledCost);
    const back = await two.returnLease({
      leaseId: fresh.leaseId,
      committed: "200",
      unusedRequests: 0,
      unusedTokens: 0,
      unsure: [],
    });
    expect(back.released).toBe("0");

    // Both keys, during the grace, are admitted only while a quote fits the one budget.
    const outcomes: string[] = [];
    for (let i = 0; i < 6; i++) outcomes.push(await request(i % 2 ? old.secret : rotated.secret));
    expect(outcomes).toEqual(["ok", ...Array(5).fill("budget_exceeded")]);
    // The books: what callers were charged == the one budget's spend (both keys show it), nothing
    // held, never past the budget.
    expect(told).toBe(1_000n);
    for (const keyId of [old.key!.keyId, newId]) {
      expect(await usage(keyId)).toMatchObject({ spent: "1000", held: "0", remaining: "0" });
    }
  });

  it("answers settlements of unknown reservations and bad amounts, and applies a key's own budget", async () => {
    const unknown = await one.settleReservation({
      reservationId: "rsv_AAAAAAAAAAAAAAAAAAAA_{nobody}",
      actualCost: "5",
      eventId: "e",
    });
    expect(unknown.outcome).toBe(SettleOutcome.UNKNOWN_RESERVATION);
    const bad = await failure(
      one.settleReservation({ reservationId: "rsv_x", actualCost: "1.5", eventId: "e" }),
    );
    expect(bad).toMatchObject({ status: GrpcStatus.INVALID_ARGUMENT, code: "invalid_argument" });

    const accountId = uniqueNamespace("acct");
    await one.createAccount({ accountId });
    await one.createConnection({ accountId, connectionId: "main", models: ["priced"] });
    const { secret, key } = await two.createKey({
      accountId,
      connectionId: "main",
      budget: { amount: "500", period: BudgetPeriod.DAYS, periodDays: 30 },
    });
    expect(key?.budget).toMatchObject({ amount: "500", period: BudgetPeriod.DAYS, periodDays: 30 });
    const ask = chatAsk(secret);
    const first = await one.authorize(ask);
    expect([first.budgetRemaining, first.keyBudgetRemaining]).toEqual(["", "300"]);
    await two.authorize(ask);
    const err = await failure(one.authorize(ask));
    expect(err).toMatchObject({ code: "budget_exceeded", details: { [BUDGET_DETAILS.scope]: "key" } });
  });
});
