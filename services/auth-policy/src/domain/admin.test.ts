import { createHash } from "node:crypto";
import { beforeEach, describe, expect, it } from "vitest";
import { createMemoryKeyStore } from "../adapters/memory-key-store.js";
import { createMemoryLedger } from "../adapters/memory-ledger.js";
import { type Admin, type CreateConnectionInput, createAdmin } from "./admin.js";
import { type AuthorizeDeps, type AuthorizeInput, authorize } from "./authorize.js";
import { type Budget, budgetChecks, newReservationId } from "./budget.js";
import { broadcastDueDeadlines, DeadlineBroadcastError } from "./deadlines.js";
import { AuthError, type AuthErrorCode } from "./errors.js";
import { acquireLease, returnLease } from "./lease.js";
import type { KeyRevocation, KeyStore, Ledger, RevocationPublisher } from "./ports.js";

const NOW = new Date("2025-06-01T12:00:00Z");
const after = (s: number) => new Date(NOW.getTime() + s * 1_000);
const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");

let store: KeyStore;
let ledger: Ledger;
let sent: KeyRevocation[];
let failBroadcasts: boolean;
let admin: Admin;

const publisher: RevocationPublisher = {
  async publish(r) {
    if (failBroadcasts) throw new Error("nats is down");
    sent.push(r);
  },
};

const conn = (over: Partial<CreateConnectionInput> = {}): CreateConnectionInput => ({
  accountId: "acme",
  connectionId: "main",
  models: ["mini", "pro"],
  defaultModel: "",
  routes: [],
  limits: { connection: {}, perKey: {}, routes: {} },
  ...over,
});

beforeEach(async () => {
  store = createMemoryKeyStore();
  ledger = createMemoryLedger();
  sent = [];
  failBroadcasts = false;
  admin = createAdmin({ store, publisher, knownModels: new Set(["mini", "pro", "reasoner"]) });
  await admin.createAccount({ accountId: "acme", limits: {} }, NOW);
  await admin.createConnection(conn(), NOW);
});

async function codeOf(p: Promise<unknown>): Promise<AuthErrorCode | "resolved"> {
  try {
    await p;
    return "resolved";
  } catch (err) {
    expect(err).toBeInstanceOf(AuthError);
    return (err as AuthError).code;
  }
}

const use = (key: string, now = NOW) =>
  authorize({ store, ledger, prices: new Map() }, { key, model: "", route: "chat" }, now).then(
    (a) => a.keyId,
    (err: AuthError) => err.code,
  );

describe("accounts and connections", () => {
  it("creates an account once", async () => {
    expect(await codeOf(admin.createAccount({ accountId: "acme", limits: {} }))).toBe("account_exists");
    const a = await admin.createAccount({ accountId: "globex", limits: { requestsPerMinute: 5 } }, NOW);
    expect(a).toEqual({ accountId: "globex", limits: { requestsPerMinute: 5 }, createdAt: NOW });
  });

  it("fills in a connection's default model and caps", async () => {
    const c = await admin.createConnection(conn({ connectionId: "other", routes: ["chat", "chat"] }), NOW);
    expect(c).toMatchObject({
      defaultModel: "mini",
      defaultMaxOutputTokens: 1024,
      maxOutputTokens: 4096,
      routes: ["chat"],
    });
    const small = await admin.createConnection(conn({ connectionId: "small", maxOutputTokens: 500 }), NOW);
    expect(small.defaultMaxOutputTokens).toBe(500);
  });

  it("refuses a connection that is invalid, duplicated or in no account", async () => {
    const bad: Array<[Partial<CreateConnectionInput>, AuthErrorCode]> = [
      [{}, "connection_exists"],
      [{ accountId: "nobody", connectionId: "x" }, "account_not_found"],
      [{ connectionId: "has space" }, "invalid_argument"],
      [{ connectionId: "x", models: [] }, "invalid_argument"],
      [{ connectionId: "x", models: ["nope"] }, "invalid_argument"],
      [{ connectionId: "x", models: ["mini", "mini"] }, "invalid_argument"],
      [{ connectionId: "x", defaultModel: "reasoner" }, "invalid_argument"],
      [{ connectionId: "x", defaultMaxOutputTokens: 5000 }, "invalid_argument"],
      [{ connectionId: "x", maxOutputTokens: 0 }, "invalid_argument"],
      [
        { connectionId: "x", limits: { connection: { requestsPerMinute: 0 }, perKey: {}, routes: {} } },
        "invalid_argument",
      ],
      [
        { connectionId: "x", limits: { connection: {}, perKey: { tokensPerMinute: 1.5 }, routes: {} } },
        "invalid_argument",
      ],
    ];
    for (const [over, code] of bad)
      expect(await codeOf(admin.createConnection(conn(over), NOW)), JSON.stringify(over)).toBe(code);
  });
});

describe("budgets", () => {
  it("gives connections and keys checked budgets, and a rotation keeps the key's budget", async () => {
    const monthly = { amount: 5_000_000n, period: "month" as const };
    const c = await admin.createConnection(conn({ connectionId: "capped", budget: monthly }), NOW);
    expect(c.budget).toEqual(monthly);
    expect((await store.connection("acme", "capped"))?.budget).toEqual(monthly);
    const bad: Budget[] = [
      { amount: -1n, period: "month" },
      { amount: 2n ** 53n, period: "day" },
      { amount: 1n, period: { days: 0 } },
      { amount: 1n, period: { days: 367 } },
    ];
    for (const budget of bad) {
      expect(await codeOf(admin.createConnection(conn({ connectionId: "bad", budget }), NOW))).toBe(
        "invalid_argument",
      );
      const key = admin.createKey({ accountId: "acme", connectionId: "main", name: "", budget }, NOW);
      expect(await codeOf(key)).toBe("invalid_argument");
    }
    const daily = { amount: 7n, period: "day" as const };
    const k = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: daily },
      NOW,
    );
    expect((await store.findById(k.key.keyId))?.budget).toEqual(daily);
    const r = await admin.rotateKey({ keyId: k.key.keyId }, NOW);
    expect((await store.findById(r.key.keyId))?.budget).toEqual(daily);
  });
});

describe("keys", () => {
  it("issues a tg_ key once, stores only its hash and last four characters", async () => {
    const { key, secret } = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "ci" },
      NOW,
    );
    expect(secret).toMatch(/^tg_[0-9A-Za-z]{40}$/);
    expect(key).toMatchObject({
      accountId: "acme",
      connectionId: "main",
      name: "ci",
      last4: secret.slice(-4),
    });
    const stored = await store.findById(key.keyId);
    expect(stored?.hash.toString("hex")).toBe(sha256(secret));
    expect(JSON.stringify(stored)).not.toContain(secret.slice(3));
    expect(await use(secret)).toBe(key.keyId);
    const second = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    expect(second.secret).not.toBe(secret);
    expect(second.key.keyId).not.toBe(key.keyId);
  });

  it("refuses a key for an unknown account or connection, or with a past expiry", async () => {
    expect(await codeOf(admin.createKey({ accountId: "x", connectionId: "main", name: "" }))).toBe(
      "account_not_found",
    );
    expect(await codeOf(admin.createKey({ accountId: "acme", connectionId: "x", name: "" }))).toBe(
      "connection_not_found",
    );
    expect(
      await codeOf(
        admin.createKey({ accountId: "acme", connectionId: "main", name: "", expiresAt: NOW }, NOW),
      ),
    ).toBe("invalid_argument");
    expect(
      await codeOf(admin.createKey({ accountId: "acme", connectionId: "main", name: "n".repeat(129) })),
    ).toBe("invalid_argument");
  });

  it("honours an expiry and broadcasts it when it falls due", async () => {
    const { key, secret } = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", expiresAt: after(30) },
      NOW,
    );
    expect(await use(secret, after(29))).toBe(key.keyId);
    expect(await use(secret, after(30))).toBe("expired_api_key");
    expect(await broadcastDueDeadlines(store, publisher, after(29))).toBe(0);
    expect(await broadcastDueDeadlines(store, publisher, after(30))).toBe(1);
    expect(sent).toEqual([
      { keyHash: sha256(secret), keyId: key.keyId, revokedAt: after(30), reason: "expired" },
    ]);
  });

  it("lists keys with their state", async () => {
    const a = await admin.createKey({ accountId: "acme", connectionId: "main", name: "a" }, NOW);
    const b = await admin.createKey({ accountId: "acme", connectionId: "main", name: "b" }, after(1));
    await admin.revokeKey(a.key.keyId, after(2));
    const listed = await admin.listKeys({ accountId: "acme", connectionId: "" });
    expect(listed.map((k) => [k.keyId, k.revokedAt])).toEqual([
      [a.key.keyId, after(2)],
      [b.key.keyId, undefined],
    ]);
    expect(await codeOf(admin.listKeys({ accountId: "nobody", connectionId: "" }))).toBe("account_not_found");
    expect(await codeOf(admin.listKeys({ accountId: "acme", connectionId: "nope" }))).toBe(
      "connection_not_found",
    );
  });
});

describe("revocation", () => {
  it("refuses the key at once and broadcasts its hash, never its secret", async () => {
    const { key, secret } = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    const revoked = await admin.revokeKey(key.keyId, after(5));
    expect(revoked.revokedAt).toEqual(after(5));
    expect(await use(secret, after(5))).toBe("revoked_api_key");
    expect(sent).toEqual([
      { keyHash: sha256(secret), keyId: key.keyId, revokedAt: after(5), reason: "revoked" },
    ]);
    expect(JSON.stringify(sent)).not.toContain(secret);
  });

  it("is idempotent: a repeat keeps the first time and broadcasts again", async () => {
    const { key } = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    await admin.revokeKey(key.keyId, after(5));
    const again = await admin.revokeKey(key.keyId, after(9));
    expect(again.revokedAt).toEqual(after(5));
    expect(sent.map((r) => r.revokedAt)).toEqual([after(5), after(5)]);
  });

  it("still revokes when the broadcast fails, and says so", async () => {
    const { key, secret } = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    failBroadcasts = true;
    expect(await codeOf(admin.revokeKey(key.keyId, after(1)))).toBe("broadcast_failed");
    expect(await use(secret, after(1))).toBe("revoked_api_key");
    failBroadcasts = false;
    await admin.revokeKey(key.keyId, after(2));
    expect(sent).toHaveLength(1);
  });

  it("refuses an unknown key", async () => {
    expect(await codeOf(admin.revokeKey("key_nope"))).toBe("key_not_found");
  });
});

describe("rotation", () => {
  it("keeps both keys working for the grace period, then only the new one, and broadcasts the end", async () => {
    const old = await admin.createKey({ accountId: "acme", connectionId: "main", name: "prod" }, NOW);
    const r = await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 120 }, after(10));
    expect(r.secret).toMatch(/^tg_[0-9A-Za-z]{40}$/);
    expect(r.key).toMatchObject({
      rotatedFrom: old.key.keyId,
      name: "prod",
      accountId: "acme",
      connectionId: "main",
    });
    expect(r.old).toMatchObject({ rotatedTo: r.key.keyId, graceEndsAt: after(130) });
    expect(await use(old.secret, after(129))).toBe(old.key.keyId);
    expect(await use(r.secret, after(129))).toBe(r.key.keyId);
    expect(await use(old.secret, after(130))).toBe("rotated_api_key");
    expect(await use(r.secret, after(130))).toBe(r.key.keyId);
    expect(sent).toEqual([]);
    await broadcastDueDeadlines(store, publisher, after(130));
    await broadcastDueDeadlines(store, publisher, after(131));
    expect(sent).toEqual([
      { keyHash: sha256(old.secret), keyId: old.key.keyId, revokedAt: after(130), reason: "rotated" },
    ]);
  });

  it("defaults to a 24 h grace, or the configured default", async () => {
    const old = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    const r = await admin.rotateKey({ keyId: old.key.keyId }, NOW);
    expect(r.old.graceEndsAt).toEqual(after(86_400));
    const short = createAdmin({ store, publisher, knownModels: new Set(), defaultGraceSeconds: 5 });
    const other = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    expect((await short.rotateKey({ keyId: other.key.keyId }, NOW)).old.graceEndsAt).toEqual(after(5));
  });

  it("ends the old key at once with a zero grace", async () => {
    const old = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    const r = await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 0 }, NOW);
    expect(await use(old.secret, NOW)).toBe("rotated_api_key");
    expect(await use(r.secret, NOW)).toBe(r.key.keyId);
    expect(await broadcastDueDeadlines(store, publisher, NOW)).toBe(1);
  });

  it("gives the new key its own expiry, none by default", async () => {
    const old = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", expiresAt: after(50) },
      NOW,
    );
    const r = await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 3_600 }, NOW);
    expect(r.key.expiresAt).toBeUndefined();
    // The old key's own expiry still ends it first.
    expect(await use(old.secret, after(50))).toBe("expired_api_key");
    const again = await admin.rotateKey({ keyId: r.key.keyId, expiresAt: after(999) }, NOW);
    expect(again.key.expiresAt).toEqual(after(999));
  });

  it("rotates a key once only, and never a revoked, expired or unknown one", async () => {
    const a = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    await admin.rotateKey({ keyId: a.key.keyId, graceSeconds: 60 }, NOW);
    expect(await codeOf(admin.rotateKey({ keyId: a.key.keyId }, NOW))).toBe("key_not_active");
    const b = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    await admin.revokeKey(b.key.keyId, NOW);
    expect(await codeOf(admin.rotateKey({ keyId: b.key.keyId }, NOW))).toBe("key_not_active");
    const c = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", expiresAt: after(1) },
      NOW,
    );
    expect(await codeOf(admin.rotateKey({ keyId: c.key.keyId }, after(1)))).toBe("key_not_active");
    expect(await codeOf(admin.rotateKey({ keyId: "key_nope" }, NOW))).toBe("key_not_found");
    expect(await codeOf(admin.rotateKey({ keyId: a.key.keyId, graceSeconds: 31 * 86_400 }, NOW))).toBe(
      "invalid_argument",
    );
  });

  it("lets a revocation end the grace early", async () => {
    const old = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 600 }, NOW);
    await admin.revokeKey(old.key.keyId, after(1));
    expect(await use(old.secret, after(2))).toBe("revoked_api_key");
  });

  it("queues a failed deadline broadcast again", async () => {
    const old = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 0 }, NOW);
    failBroadcasts = true;
    await expect(broadcastDueDeadlines(store, publisher, NOW)).rejects.toThrow(DeadlineBroadcastError);
    failBroadcasts = true;
    await expect(broadcastDueDeadlines(store, publisher, NOW)).rejects.toThrow("nats is down");
    failBroadcasts = false;
    expect(await broadcastDueDeadlines(store, publisher, NOW)).toBe(1);
    expect(sent.map((r) => r.reason)).toEqual(["rotated"]);
  });

  it("throws a store failure of the sweep as it is, not as a broadcast failure", async () => {
    const down = new Error("Connection is closed.");
    const broken = {
      ...store,
      takeDueDeadlines: async () => {
        throw down;
      },
    };
    await expect(broadcastDueDeadlines(broken, publisher, NOW)).rejects.toBe(down);
  });
});

describe("a rotated key's budget", () => {
  // A quarter of a base unit per input token: a request of 8 bytes, 1 message and a cap of 0
  // (an input bound of 32 tokens, docs/money.md, "The quote") is quoted 8 and charged that.
  const unit = { inputPerMillion: 250_000n, outputPerMillion: 1_000_000n };
  const DAY = { amount: 100n, period: "day" as const };
  let deps: AuthorizeDeps;
  const ask = (key: string): AuthorizeInput => ({
    key,
    model: "mini",
    route: "chat",
    bodyBytes: 8,
    messageCount: 1,
    maxOutputTokens: 0,
  });
  let events = 0;
  /** One request on `key`, charged its whole quote; what it was charged, or its refusal's code. */
  const spend = async (key: string, now = NOW): Promise<bigint | string> => {
    const a = await authorize(deps, ask(key), now).catch((err: AuthError) => err);
    if (a instanceof AuthError) return a.code;
    const s = await ledger.settle(a.reservationId!, a.quote!, `evt_${++events}`, now);
    expect(s.uncharged).toBeUndefined();
    return s.cost!;
  };
  const spentOf = async (keyId: string, now = NOW) => admin.keyUsage(await admin.getKey(keyId), now);

  beforeEach(() => {
    admin = createAdmin({ store, publisher, knownModels: new Set(["mini", "pro"]), ledger });
    deps = { store, ledger, prices: new Map([["mini", unit]]) };
  });

  it("is spent from one counter by the old and the new key during the grace and after it", async () => {
    const old = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: DAY },
      NOW,
    );
    let told = 0n;
    for (let i = 0; i < 9; i++) told += (await spend(old.secret)) as bigint;
    expect(told).toBe(72n);
    const r = await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 3_600 }, after(1));
    // The new key shows the lineage's spend, not a fresh counter.
    expect(await spentOf(r.key.keyId, after(1))).toMatchObject({ spent: 72n, held: 0n, remaining: 28n });
    expect(r.key).toMatchObject({ budget: DAY, lineageId: old.key.keyId });
    // Both keys, taking turns, are admitted only while their quote fits what is left of the one
    // budget: three more requests, never nine more per key.
    const outcomes: Array<bigint | string> = [];
    for (let i = 0; i < 10; i++) outcomes.push(await spend(i % 2 ? old.secret : r.secret, after(2)));
    const served = outcomes.filter((o): o is bigint => typeof o === "bigint");
    expect(served).toEqual([8n, 8n, 8n]);
    expect(outcomes.filter((o) => typeof o === "string")).toEqual(Array(7).fill("budget_exceeded"));
    told += served.reduce((a, b) => a + b, 0n);
    expect(told).toBe(96n);
    // What callers were charged is what both keys show spent; nothing is held, nothing below zero.
    for (const id of [old.key.keyId, r.key.keyId]) {
      expect(await spentOf(id, after(2))).toMatchObject({ spent: told, held: 0n, remaining: 4n });
    }
    // After the grace, and after a second rotation, the lineage still spends from that counter.
    const again = await admin.rotateKey({ keyId: r.key.keyId, graceSeconds: 0 }, after(3_601));
    expect(again.key.lineageId).toBe(old.key.keyId);
    expect(await spend(again.secret, after(3_602))).toBe("budget_exceeded");
    expect(await spentOf(again.key.keyId, after(3_602))).toMatchObject({ spent: 96n, remaining: 4n });
    // The next period counts from zero for the whole lineage.
    const tomorrow = new Date("2025-06-02T00:00:01Z");
    expect(await spend(again.secret, tomorrow)).toBe(8n);
    expect(await spentOf(again.key.keyId, tomorrow)).toMatchObject({ spent: 8n, remaining: 92n });
  });

  it("shares its leases' allowances: a lease of each key together never holds more than is left", async () => {
    const old = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: DAY },
      NOW,
    );
    for (let i = 0; i < 5; i++) expect(await spend(old.secret)).toBe(8n);
    const r = await admin.rotateKey({ keyId: old.key.keyId }, NOW);
    // 60 left: the new key's lease takes half of it, the old key's half of what is left then.
    const fresh = await acquireLease(deps, ask(r.secret), 100, NOW);
    expect(fresh.lease?.budget).toBe(30n);
    expect(fresh.verdict.keyBudgetRemaining).toBe(30n);
    const prior = await acquireLease(deps, ask(old.secret), 100, NOW);
    expect(prior.lease?.budget).toBe(15n);
    expect(prior.verdict.keyBudgetRemaining).toBe(15n);
    expect(await spentOf(r.key.keyId)).toMatchObject({ spent: 40n, held: 45n, remaining: 15n });
    // Each lease is charged one request, then returned with that request committed.
    const released: bigint[] = [];
    for (const lease of [fresh.lease!, prior.lease!]) {
      expect(await ledger.settle(`${lease.leaseId}~1`, 8n, `evt_${++events}`, NOW)).toEqual({
        outcome: "settled",
        cost: 8n,
      });
      const back = { committed: 8n, unusedRequests: 0, unusedTokens: 0, unsure: [] };
      released.push((await returnLease(ledger, lease.leaseId, back, NOW)).released);
    }
    expect(released).toEqual([22n, 7n]);
    // 44 left: five more requests of either key, then the lineage is at 96 of 100, nothing held.
    const outcomes: Array<bigint | string> = [];
    for (let i = 0; i < 8; i++) outcomes.push(await spend(i % 2 ? old.secret : r.secret));
    expect(outcomes).toEqual([8n, 8n, 8n, 8n, 8n, "budget_exceeded", "budget_exceeded", "budget_exceeded"]);
    for (const id of [old.key.keyId, r.key.keyId]) {
      expect(await spentOf(id)).toMatchObject({ spent: 96n, held: 0n, remaining: 4n });
    }
  });

  it("shares its per-key rate limit with its successor during the grace, never one allowance each", async () => {
    await admin.createConnection(
      conn({
        connectionId: "limited",
        limits: { connection: {}, perKey: { requestsPerMinute: 3 }, routes: {} },
      }),
      NOW,
    );
    const old = await admin.createKey({ accountId: "acme", connectionId: "limited", name: "" }, NOW);
    const admitted = async (key: string) =>
      authorize(deps, ask(key), NOW).then(
        () => "admitted",
        (err: AuthError) => err.code,
      );
    expect([await admitted(old.secret), await admitted(old.secret)]).toEqual(["admitted", "admitted"]);
    const r = await admin.rotateKey({ keyId: old.key.keyId, graceSeconds: 3_600 }, NOW);
    expect([await admitted(r.secret), await admitted(r.secret), await admitted(old.secret)]).toEqual([
      "admitted",
      "rate_limited",
      "rate_limited",
    ]);
  });

  it("stays a key's own for a key stored without a lineage", async () => {
    const old = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: DAY },
      NOW,
    );
    for (let i = 0; i < 9; i++) expect(await spend(old.secret)).toBe(8n);
    const other = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: DAY },
      NOW,
    );
    expect(other.key.lineageId).toBeUndefined();
    expect(await spentOf(other.key.keyId)).toMatchObject({ spent: 0n, remaining: 100n });
    expect(await spend(other.secret)).toBe(8n);
    expect(await spentOf(old.key.keyId)).toMatchObject({ spent: 72n, remaining: 28n });
  });
});

describe("listing, showing, updating and deleting", () => {
  it("lists accounts and shows one with its connections", async () => {
    await admin.createAccount({ accountId: "globex", limits: {} }, NOW);
    expect((await admin.listAccounts()).map((a) => a.accountId)).toEqual(["acme", "globex"]);
    const shown = await admin.getAccount("acme");
    expect(shown.account.accountId).toBe("acme");
    expect(shown.connections.map((c) => c.connectionId)).toEqual(["main"]);
    expect(await codeOf(admin.getAccount("nobody"))).toBe("account_not_found");
    expect(await codeOf(admin.getConnection("acme", "nope"))).toBe("connection_not_found");
  });

  it("sets, keeps and clears budgets of connections and keys, and replaces limits", async () => {
    const weekly = { amount: 7_000_000n, period: "week" as const };
    const c = await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      budget: weekly,
      clearBudget: false,
    });
    expect(c.budget).toEqual(weekly);
    const limits = { connection: { requestsPerMinute: 9 }, perKey: {}, routes: {} };
    const kept = await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      clearBudget: false,
      limits,
    });
    expect(kept.budget).toEqual(weekly);
    expect((await admin.getConnection("acme", "main")).limits.connection.requestsPerMinute).toBe(9);
    const cleared = await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      clearBudget: true,
    });
    expect(cleared.budget).toBeUndefined();

    const { key } = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    const daily = { amount: 1n, period: "day" as const };
    expect((await admin.updateKey({ keyId: key.keyId, budget: daily, clearBudget: false })).budget).toEqual(
      daily,
    );
    expect((await admin.getKey(key.keyId)).budget).toEqual(daily);
    expect((await admin.updateKey({ keyId: key.keyId, clearBudget: true })).budget).toBeUndefined();
    expect(await codeOf(admin.updateKey({ keyId: "nope", clearBudget: true }))).toBe("key_not_found");
    expect(
      await codeOf(
        admin.updateKey({ keyId: key.keyId, budget: { amount: -1n, period: "day" }, clearBudget: false }),
      ),
    ).toBe("invalid_argument");
  });

  it("deleting a connection revokes its keys, broadcast, and the keys stop working", async () => {
    await admin.createConnection(conn({ connectionId: "other" }), NOW);
    const a = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    const b = await admin.createKey({ accountId: "acme", connectionId: "other", name: "" }, NOW);
    const revoked = await admin.deleteConnection("acme", "main", NOW);
    expect(revoked.map((k) => k.keyId)).toEqual([a.key.keyId]);
    expect(sent.map((r) => r.keyId)).toEqual([a.key.keyId]);
    expect(await use(a.secret)).toBe("revoked_api_key");
    expect(await use(b.secret)).toBe(b.key.keyId);
    expect(await codeOf(admin.getConnection("acme", "main"))).toBe("connection_not_found");
  });

  it("deleting an account revokes every key, removes its connections, and frees its id", async () => {
    const a = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    await admin.deleteAccount("acme", NOW);
    expect(sent.map((r) => r.keyId)).toEqual([a.key.keyId]);
    expect(await use(a.secret)).toBe("revoked_api_key");
    expect(await codeOf(admin.getAccount("acme"))).toBe("account_not_found");
    expect(await admin.listAccounts()).toEqual([]);
    expect(await store.listConnections("acme")).toEqual([]);
    expect(await codeOf(admin.deleteAccount("acme"))).toBe("account_not_found");
  });
});

describe("a budget's period", () => {
  // Day budget 300 with 234 spent today (six requests of cost 39, each held at a quote of 40),
  // then the operator asks for 300 a month instead.
  const DAY = { amount: 300n, period: "day" as const };
  const MONTH = { amount: 300n, period: "month" as const };
  const QUOTE = 40n;

  /** Holds a quote against the connection's (and the key's) budgets; settles it at `cost` when admitted. */
  async function request(keyId: string, cost: bigint, now = NOW): Promise<boolean> {
    const c = await admin.getConnection("acme", "main");
    const k = await admin.getKey(keyId);
    const budgets = budgetChecks({
      accountId: "acme",
      connectionId: "main",
      keyLineageId: keyId,
      connectionBudget: c.budget,
      keyBudget: k.budget,
      now,
    });
    const id = newReservationId("acme");
    const a = await ledger.admit([], { hold: { reservationId: id, amount: QUOTE, budgets } }, now);
    if (a.admitted) await ledger.settle(id, cost, `evt_${id}`, now);
    return a.admitted;
  }

  beforeEach(async () => {
    admin = createAdmin({ store, publisher, knownModels: new Set(["mini", "pro"]), ledger });
  });

  it("is not changed in place: the connection's spend this period stays counted and caps the next requests", async () => {
    await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      budget: DAY,
      clearBudget: false,
    });
    const { key } = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    let told = 0n;
    for (let i = 0; i < 6; i++) {
      expect(await request(key.keyId, 39n)).toBe(true);
      told += 39n;
    }
    const change = (budget: Budget) =>
      admin.updateConnection({ accountId: "acme", connectionId: "main", budget, clearBudget: false });
    const refused = await change(MONTH).catch((err: AuthError) => err);
    expect(refused).toBeInstanceOf(AuthError);
    expect(refused).toMatchObject({ code: "budget_period_change" });
    expect((refused as AuthError).message).toContain("'day'");
    expect(await codeOf(change({ amount: 300n, period: "week" }))).toBe("budget_period_change");
    expect(await codeOf(change({ amount: 300n, period: { days: 1 } }))).toBe("budget_period_change");
    // The budget and its spend are as they were: what the operator reads is what was spent.
    const c = await admin.getConnection("acme", "main");
    expect(c.budget).toEqual(DAY);
    expect(await admin.connectionUsage(c, NOW)).toMatchObject({
      spent: told,
      held: 0n,
      remaining: 300n - told,
    });
    // The next requests are admitted only while they fit what is left; spend never passes 300.
    let served = 0;
    while (await request(key.keyId, 39n)) {
      told += 39n;
      served++;
    }
    expect(served).toBe(1);
    const usage = await admin.connectionUsage(await admin.getConnection("acme", "main"), NOW);
    expect(usage).toMatchObject({ spent: told, held: 0n });
    expect(told).toBeLessThanOrEqual(300n);
    expect(usage!.remaining).toBeGreaterThanOrEqual(0n);
    // The amount may change within the same period; the spend stays counted.
    const raised = await change({ amount: 500n, period: "day" });
    expect(await admin.connectionUsage(raised, NOW)).toMatchObject({ spent: told, remaining: 500n - told });
  });

  it("is not changed in place on a key's own budget either", async () => {
    const { key } = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: DAY },
      NOW,
    );
    for (let i = 0; i < 6; i++) expect(await request(key.keyId, 39n)).toBe(true);
    expect(await codeOf(admin.updateKey({ keyId: key.keyId, budget: MONTH, clearBudget: false }))).toBe(
      "budget_period_change",
    );
    const k = await admin.getKey(key.keyId);
    expect(k.budget).toEqual(DAY);
    expect(await admin.keyUsage(k, NOW)).toMatchObject({ spent: 234n, held: 0n, remaining: 66n });
    expect(await request(key.keyId, 39n)).toBe(true);
    expect(await request(key.keyId, 39n)).toBe(false);
  });

  it("changes only by clearing the budget and setting the new one, which counts from that moment", async () => {
    await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      budget: DAY,
      clearBudget: false,
    });
    const { key } = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: DAY },
      NOW,
    );
    for (let i = 0; i < 6; i++) expect(await request(key.keyId, 39n)).toBe(true);
    await admin.updateConnection({ accountId: "acme", connectionId: "main", clearBudget: true });
    const c = await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      budget: MONTH,
      clearBudget: false,
    });
    expect(c.budget).toEqual(MONTH);
    expect(await admin.connectionUsage(c, NOW)).toMatchObject({ spent: 0n, held: 0n });
    await admin.updateKey({ keyId: key.keyId, clearBudget: true });
    const k = await admin.updateKey({ keyId: key.keyId, budget: MONTH, clearBudget: false });
    expect(k.budget).toEqual(MONTH);
    // A budget set where there was none, and one whose period stays, are taken as before.
    const other = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    expect(
      (await admin.updateKey({ keyId: other.key.keyId, budget: DAY, clearBudget: false })).budget,
    ).toEqual(DAY);
  });
});

describe("budget spend", () => {
  it("shows a budget's settled spend, holds and what is left in its current period", async () => {
    admin = createAdmin({ store, publisher, knownModels: new Set(["mini"]), ledger });
    const weekly = { amount: 1_000n, period: "week" as const };
    const c = await admin.updateConnection({
      accountId: "acme",
      connectionId: "main",
      budget: weekly,
      clearBudget: false,
    });
    const { key } = await admin.createKey(
      { accountId: "acme", connectionId: "main", name: "", budget: weekly },
      NOW,
    );
    const checks = budgetChecks({
      accountId: "acme",
      connectionId: "main",
      keyLineageId: key.keyId,
      connectionBudget: weekly,
      keyBudget: weekly,
      now: NOW,
    });
    const running = newReservationId("acme");
    const done = newReservationId("acme");
    await ledger.admit([], { hold: { reservationId: running, amount: 300n, budgets: checks } }, NOW);
    await ledger.admit([], { hold: { reservationId: done, amount: 200n, budgets: checks } }, NOW);
    await ledger.settle(done, 150n, "evt-1", NOW);
    const week = {
      periodStart: new Date("2025-05-26T00:00:00Z"),
      periodEnd: new Date("2025-06-02T00:00:00Z"),
    };
    expect(await admin.connectionUsage(c, NOW)).toEqual({
      spent: 150n,
      held: 300n,
      remaining: 550n,
      ...week,
    });
    expect(await admin.keyUsage(key, NOW)).toEqual({ spent: 150n, held: 300n, remaining: 550n, ...week });
    // Reading holds nothing.
    expect(await admin.connectionUsage(c, NOW)).toEqual({
      spent: 150n,
      held: 300n,
      remaining: 550n,
      ...week,
    });
    const unbudgeted = await admin.createKey({ accountId: "acme", connectionId: "main", name: "" }, NOW);
    expect(await admin.keyUsage(unbudgeted.key, NOW)).toBeUndefined();
  });
});
