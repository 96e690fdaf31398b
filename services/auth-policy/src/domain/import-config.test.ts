import { createHash } from "node:crypto";
import { type GatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { createMemoryKeyStore } from "../adapters/memory-key-store.js";
import { importConfig } from "./import-config.js";
import { hashKey } from "./keys.js";

const T0 = new Date("2025-06-01T12:00:00Z");
const later = (s: number) => new Date(T0.getTime() + s * 1_000);
const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");

const A = "tg_dev_key_aaaaaaaaaaaaaaaaaaaa";
const B = "tg_dev_key_bbbbbbbbbbbbbbbbbbbb";
const B2 = "tg_dev_key_bbbbbbbbbbbbbbbbbbb2";

function config(
  keys: Array<Record<string, unknown>>,
  connectionBudget?: Record<string, unknown>,
): GatewayConfig {
  return parseGatewayConfig({
    upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:1/v1" }],
    models: [
      {
        id: "m",
        upstream: "u",
        upstreamModel: "m",
        runtime: "vllm",
        pricing: { inputPerMillion: 1, outputPerMillion: 1 },
      },
    ],
    accounts: [
      {
        id: "acme",
        limits: { requestsPerMinute: 60 },
        connections: [
          {
            id: "main",
            models: ["m"],
            defaultModel: "m",
            routes: ["chat"],
            limits: { keyRequestsPerMinute: 5, routes: { chat: { tokensPerMinute: 100 } } },
            ...(connectionBudget ? { budget: connectionBudget } : {}),
            keys,
          },
        ],
      },
    ],
  });
}

describe("importConfig", () => {
  it("loads accounts, connections with routes and limits, and hashed keys", async () => {
    const store = createMemoryKeyStore();
    await importConfig(store, config([{ id: "a", secret: A }]), T0);
    expect(await store.account("acme")).toEqual({
      accountId: "acme",
      limits: { requestsPerMinute: 60 },
      createdAt: T0,
    });
    expect(await store.connection("acme", "main")).toMatchObject({
      routes: ["chat"],
      limits: {
        connection: {},
        perKey: { requestsPerMinute: 5 },
        routes: { chat: { tokensPerMinute: 100 } },
      },
    });
    const k = await store.findByHash(hashKey(A));
    expect(k).toMatchObject({
      keyId: "a",
      accountId: "acme",
      connectionId: "main",
      last4: "aaaa",
      createdAt: T0,
    });
    expect(JSON.stringify(k)).not.toContain(A);
  });

  it("is idempotent, and never undoes a run-time revocation", async () => {
    const store = createMemoryKeyStore();
    const cfg = config([{ id: "a", secret: A }]);
    await importConfig(store, cfg, T0);
    await store.revokeKey("a", later(5));
    await importConfig(store, cfg, later(10));
    await importConfig(store, cfg, later(20));
    const k = await store.findById("a");
    expect(k?.revokedAt).toEqual(later(5));
    expect(k?.createdAt).toEqual(T0);
    expect(await store.listKeys("acme")).toHaveLength(1);
  });

  it("revokes, and queues for broadcast, a key whose secret changed or that left the file", async () => {
    const store = createMemoryKeyStore();
    await importConfig(
      store,
      config([
        { id: "a", secret: A },
        { id: "b", secret: B },
      ]),
      T0,
    );
    await importConfig(store, config([{ id: "b", secret: B2 }]), later(10));
    expect((await store.findByHash(hashKey(A)))?.revokedAt).toEqual(later(10));
    expect((await store.findByHash(hashKey(B)))?.revokedAt).toEqual(later(10));
    expect((await store.findByHash(hashKey(B2)))?.revokedAt).toBeUndefined();
    expect((await store.findById("b"))?.hash.toString("hex")).toBe(sha256(B2));
    const due = await store.takeDueDeadlines(later(10), 10);
    expect(due.map((d) => [d.reason, d.keyId, d.keyHash]).sort()).toEqual(
      [
        ["revoked", "a", sha256(A)],
        ["revoked", "b", sha256(B)],
      ].sort(),
    );
    expect(await store.configKeyIds()).toEqual(["b"]);
  });

  it("applies a configured revocation and expiry, and queues the expiry", async () => {
    const store = createMemoryKeyStore();
    await importConfig(
      store,
      config([
        { id: "a", secret: A, revoked: true },
        { id: "b", sha256: sha256(B), expiresAt: "2025-06-01T13:00:00Z" },
      ]),
      T0,
    );
    expect((await store.findById("a"))?.revokedAt).toEqual(T0);
    expect(await store.findById("b")).toMatchObject({
      expiresAt: new Date("2025-06-01T13:00:00Z"),
      last4: "",
    });
    expect(await store.takeDueDeadlines(later(3_600), 10)).toEqual([
      { at: later(3_600), reason: "expired", keyId: "b", keyHash: sha256(B) },
    ]);
  });

  it("reports each budget whose period the file changed, and only those", async () => {
    const store = createMemoryKeyStore();
    const day = { amount: "300", period: "day" };
    const keys = (period: unknown) => [
      { id: "a", secret: A, budget: { amount: "50", period } },
      { id: "b", secret: B },
    ];
    expect(await importConfig(store, config(keys("day"), day), T0)).toEqual([]);
    // The amount may change freely: the period's spend stays counted against it.
    expect(await importConfig(store, config(keys("day"), { ...day, amount: "500" }), later(10))).toEqual([]);
    const changed = await importConfig(
      store,
      config(keys({ days: 7 }), { ...day, period: "month" }),
      later(20),
    );
    expect(changed).toEqual([
      { scope: "connection", id: "main", from: "day", to: "month" },
      { scope: "key", id: "a", from: "day", to: "7-day" },
    ]);
    expect((await store.connection("acme", "main"))?.budget?.period).toBe("month");
    expect(
      await importConfig(store, config(keys({ days: 7 }), { ...day, period: "month" }), later(30)),
    ).toEqual([]);
  });
});
