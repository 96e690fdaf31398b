// The behaviour every KeyStore must show; run against memory (unit) and Redis (integration).
import { expect, it } from "vitest";
import { hashKey } from "../src/domain/keys.js";
import type { ConnectionPolicy, KeyRecord, KeyStore } from "../src/domain/ports.js";

/** A fresh, empty store for each test. */
export type StoreFactory = () => Promise<KeyStore> | KeyStore;

const T0 = new Date("2025-06-01T12:00:00Z");
const later = (s: number) => new Date(T0.getTime() + s * 1_000);

function connection(accountId: string, connectionId: string): ConnectionPolicy {
  return {
    accountId,
    connectionId,
    models: ["pro", "mini"],
    defaultModel: "mini",
    defaultMaxOutputTokens: 256,
    maxOutputTokens: 2048,
    routes: ["chat", "models"],
    limits: { connection: { requestsPerMinute: 5 }, perKey: {}, routes: { chat: { tokensPerMinute: 900 } } },
    createdAt: T0,
  };
}

let serial = 0;
function key(over: Partial<KeyRecord> & { secret?: string } = {}): KeyRecord {
  const { secret = `tg_contract_secret_${++serial}_abcdefgh`, ...rest } = over;
  return {
    keyId: `k${serial}`,
    hash: hashKey(secret),
    accountId: "acme",
    connectionId: "main",
    name: "",
    createdAt: later(serial),
    last4: secret.slice(-4),
    ...rest,
  };
}

async function seeded(make: StoreFactory): Promise<KeyStore> {
  const store = await make();
  await store.createAccount({ accountId: "acme", limits: { requestsPerMinute: 100 }, createdAt: T0 });
  await store.createConnection(connection("acme", "main"));
  await store.createConnection(connection("acme", "side"));
  // A running service's store is always seeded (app.ts imports the configuration first).
  await store.setConfigKeyIds([]);
  return store;
}

export function keyStoreContract(make: StoreFactory): void {
  it("creates accounts and connections once and reads them back with the account's limits", async () => {
    const store = await seeded(make);
    expect(await store.createAccount({ accountId: "acme", limits: {}, createdAt: later(5) })).toBe(false);
    expect(await store.createConnection({ ...connection("acme", "main"), models: ["x"] })).toBe(false);
    expect(await store.account("acme")).toEqual({
      accountId: "acme",
      limits: { requestsPerMinute: 100 },
      createdAt: T0,
    });
    const policy = await store.policy("acme", "main");
    expect(policy?.connection).toEqual(connection("acme", "main"));
    expect(policy?.account?.limits).toEqual({ requestsPerMinute: 100 });
    expect(await store.policy("acme", "nope")).toBeUndefined();
    expect(await store.connection("nobody", "main")).toBeUndefined();
  });

  it("replaces accounts and connections on import but keeps when they were first created", async () => {
    const store = await seeded(make);
    await store.putAccount({ accountId: "acme", limits: { tokensPerMinute: 7 }, createdAt: later(60) });
    expect(await store.account("acme")).toEqual({
      accountId: "acme",
      limits: { tokensPerMinute: 7 },
      createdAt: T0,
    });
    await store.putConnection({ ...connection("acme", "main"), models: ["mini"], createdAt: later(60) });
    expect(await store.connection("acme", "main")).toMatchObject({ models: ["mini"], createdAt: T0 });
    await store.putConnection(connection("beta", "new"));
    expect(await store.connection("beta", "new")).toBeDefined();
  });

  it("finds a key by hash and by id, and refuses a second key with the same id or hash", async () => {
    const store = await seeded(make);
    const k = key({ secret: "tg_same_secret_for_both_0001", expiresAt: later(3_600) });
    expect(await store.createKey(k)).toBe(true);
    expect(await store.findByHash(k.hash)).toEqual(k);
    expect(await store.findById(k.keyId)).toEqual(k);
    expect(await store.createKey({ ...k, keyId: "other" })).toBe(false);
    expect(await store.createKey({ ...key(), keyId: k.keyId })).toBe(false);
    expect(await store.findByHash(hashKey("tg_unknown"))).toBeUndefined();
    expect(await store.findById("unknown")).toBeUndefined();
  });

  it("lists the keys of a connection or a whole account, oldest first", async () => {
    const store = await seeded(make);
    const a = key({ createdAt: later(30) });
    const b = key({ createdAt: later(10), connectionId: "side" });
    const c = key({ createdAt: later(20) });
    for (const k of [a, b, c]) expect(await store.createKey(k)).toBe(true);
    expect((await store.listKeys("acme", "main")).map((k) => k.keyId)).toEqual([c.keyId, a.keyId]);
    expect((await store.listKeys("acme")).map((k) => k.keyId)).toEqual([b.keyId, c.keyId, a.keyId]);
    expect(await store.listKeys("acme", "empty")).toEqual([]);
    expect(await store.listKeys("nobody")).toEqual([]);
  });

  it("revokes once: a repeat keeps the first time", async () => {
    const store = await seeded(make);
    const k = key();
    await store.createKey(k);
    expect((await store.revokeKey(k.keyId, later(100)))?.revokedAt).toEqual(later(100));
    expect((await store.revokeKey(k.keyId, later(200)))?.revokedAt).toEqual(later(100));
    expect((await store.findByHash(k.hash))?.revokedAt).toEqual(later(100));
    expect(await store.revokeKey("unknown", later(1))).toBeUndefined();
  });

  it("rotates a working key once and queues the end of its grace", async () => {
    const store = await seeded(make);
    const old = key();
    await store.createKey(old);
    const fresh = key({ rotatedFrom: old.keyId, lineageId: old.keyId, expiresAt: later(9_000) });
    const outcome = await store.rotateKey(old.keyId, fresh, later(600), later(100));
    expect(outcome).toEqual({ ok: true, old: { ...old, rotatedTo: fresh.keyId, graceEndsAt: later(600) } });
    // The lineage, which names the key budget's counter, is kept with the record.
    expect(await store.findByHash(fresh.hash)).toEqual(fresh);
    expect((await store.findById(fresh.keyId))?.lineageId).toBe(old.keyId);
    expect(await store.rotateKey(old.keyId, key(), later(700), later(101))).toEqual({
      ok: false,
      reason: "rotated",
    });
    const due = await store.takeDueDeadlines(later(600), 10);
    expect(due).toEqual([
      { at: later(600), reason: "rotated", keyId: old.keyId, keyHash: old.hash.toString("hex") },
    ]);
    expect(await store.takeDueDeadlines(later(9_000), 10)).toEqual([
      { at: later(9_000), reason: "expired", keyId: fresh.keyId, keyHash: fresh.hash.toString("hex") },
    ]);
  });

  it("refuses to rotate a revoked, expired or unknown key, or onto an existing key", async () => {
    const store = await seeded(make);
    const revoked = key();
    const expired = key({ expiresAt: later(50) });
    const fine = key();
    for (const k of [revoked, expired, fine]) await store.createKey(k);
    await store.revokeKey(revoked.keyId, later(1));
    expect(await store.rotateKey(revoked.keyId, key(), later(500), later(60))).toEqual({
      ok: false,
      reason: "revoked",
    });
    expect(await store.rotateKey(expired.keyId, key(), later(500), later(50))).toEqual({
      ok: false,
      reason: "expired",
    });
    expect(await store.rotateKey("unknown", key(), later(500), later(60))).toEqual({
      ok: false,
      reason: "not_found",
    });
    expect(
      await store.rotateKey(fine.keyId, { ...key(), hash: revoked.hash }, later(500), later(60)),
    ).toEqual({
      ok: false,
      reason: "conflict",
    });
    // Nothing changed on a refusal.
    expect((await store.findById(fine.keyId))?.rotatedTo).toBeUndefined();
  });

  it("hands each due deadline out once, in time order, and takes it back when asked", async () => {
    const store = await make();
    const d = (s: number, id: string) => ({
      at: later(s),
      reason: "expired" as const,
      keyId: id,
      keyHash: "ab".repeat(32),
    });
    await store.addDeadlines([d(30, "c"), d(10, "a"), d(20, "b"), d(99, "late")]);
    // The same reason, key and hash is one deadline: re-adding moves it.
    await store.addDeadlines([d(5, "a")]);
    expect(await store.takeDueDeadlines(later(30), 2)).toEqual([d(5, "a"), d(20, "b")]);
    expect(await store.takeDueDeadlines(later(30), 10)).toEqual([d(30, "c")]);
    expect(await store.takeDueDeadlines(later(30), 10)).toEqual([]);
    await store.addDeadlines([d(30, "c")]);
    expect(await store.takeDueDeadlines(later(98), 10)).toEqual([d(30, "c")]);
  });

  it("keeps budgets of connections and keys exactly, and lets the file own a key's budget", async () => {
    const store = await seeded(make);
    const budgeted = {
      ...connection("acme", "capped"),
      budget: { amount: 9_007_199_254_740_991n, period: "week" as const },
    };
    await store.createConnection(budgeted);
    expect(await store.connection("acme", "capped")).toEqual(budgeted);
    await store.putConnection({ ...budgeted, budget: { amount: 5n, period: { days: 30 } } });
    expect((await store.connection("acme", "capped"))?.budget).toEqual({ amount: 5n, period: { days: 30 } });
    await store.putConnection(connection("acme", "capped"));
    expect((await store.connection("acme", "capped"))?.budget).toBeUndefined();

    const k = key({ budget: { amount: 1_000_000n, period: "month" } });
    expect(await store.createKey(k)).toBe(true);
    expect(await store.findById(k.keyId)).toEqual(k);
    const c = key();
    await store.importKey({ ...c, budget: { amount: 7n, period: "day" } }, false);
    expect((await store.findById(c.keyId))?.budget).toEqual({ amount: 7n, period: "day" });
    await store.importKey(c, false);
    expect((await store.findById(c.keyId))?.budget).toBeUndefined();
  });

  it("imports a configured key: the file owns its expiry, a revocation stays", async () => {
    const store = await seeded(make);
    const k = key({ expiresAt: later(100) });
    await store.importKey(k, false);
    expect(await store.findByHash(k.hash)).toEqual(k);
    await store.importKey({ ...k, createdAt: later(500), expiresAt: undefined }, false);
    const reread = await store.findById(k.keyId);
    expect(reread?.expiresAt).toBeUndefined();
    expect(reread?.createdAt).toEqual(k.createdAt);
    await store.revokeKey(k.keyId, later(7));
    await store.importKey(k, false);
    expect((await store.findById(k.keyId))?.revokedAt).toEqual(later(7));
    const m = key();
    await store.importKey(m, true);
    expect((await store.findById(m.keyId))?.revokedAt).toEqual(m.createdAt);
    expect((await store.listKeys("acme", "main")).map((x) => x.keyId)).toEqual([k.keyId, m.keyId]);
  });

  it("lists accounts and connections by id, deletes them, and sets or clears a key's budget", async () => {
    const store = await make();
    for (const id of ["globex", "acme"])
      await store.createAccount({ accountId: id, limits: {}, createdAt: T0 });
    await store.putAccount({ accountId: "initech", limits: { requestsPerMinute: 3 }, createdAt: T0 });
    for (const c of ["zeta", "main"]) await store.createConnection(connection("acme", c));
    expect((await store.listAccounts()).map((a) => a.accountId)).toEqual(["acme", "globex", "initech"]);
    expect((await store.listConnections("acme")).map((c) => c.connectionId)).toEqual(["main", "zeta"]);
    expect(await store.listConnections("globex")).toEqual([]);

    const k = key();
    await store.createKey(k);
    const budget = { amount: 9_007_199_254_740_991n, period: { days: 30 } };
    expect((await store.setKeyBudget(k.keyId, budget))?.budget).toEqual(budget);
    expect((await store.findByHash(k.hash))?.budget).toEqual(budget);
    expect((await store.setKeyBudget(k.keyId, undefined))?.budget).toBeUndefined();
    expect((await store.findById(k.keyId))?.budget).toBeUndefined();
    expect(await store.setKeyBudget("nope", budget)).toBeUndefined();

    await store.deleteConnection("acme", "zeta");
    expect(await store.connection("acme", "zeta")).toBeUndefined();
    expect((await store.listConnections("acme")).map((c) => c.connectionId)).toEqual(["main"]);
    await store.deleteConnection("acme", "main");
    await store.deleteAccount("acme");
    expect(await store.account("acme")).toBeUndefined();
    expect((await store.listAccounts()).map((a) => a.accountId)).toEqual(["globex", "initech"]);
    // A deleted account's id can be created again.
    expect(await store.createAccount({ accountId: "acme", limits: {}, createdAt: T0 })).toBe(true);
  });

  it("remembers which key ids the configuration declared, and that it was seeded", async () => {
    const store = await make();
    expect(await store.configKeyIds()).toEqual([]);
    expect(await store.seeded()).toBe(false);
    await store.setConfigKeyIds(["a", "b"]);
    expect(await store.seeded()).toBe(true);
    expect((await store.configKeyIds()).sort()).toEqual(["a", "b"]);
    await store.setConfigKeyIds([]);
    expect(await store.configKeyIds()).toEqual([]);
    expect(await store.seeded()).toBe(true);
  });
}
