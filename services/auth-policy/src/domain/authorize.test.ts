import { createHash } from "node:crypto";
import { parseGatewayConfig, quoteOf } from "@tollgate/config";
import { beforeEach, describe, expect, it } from "vitest";
import { createMemoryKeyStore } from "../adapters/memory-key-store.js";
import { createMemoryLedger } from "../adapters/memory-ledger.js";
import { createAdmin } from "./admin.js";
import { type AuthorizeDeps, type AuthorizeInput, authorize } from "./authorize.js";
import { AuthError, type AuthErrorCode } from "./errors.js";
import { importConfig } from "./import-config.js";

const NOW = new Date("2025-06-01T12:00:00Z");
const after = (s: number) => new Date(NOW.getTime() + s * 1_000);

const LIVE = "tg_live_aaaaaaaaaaaaaaaaaaaaaaaa";
const REVOKED = "tg_live_rrrrrrrrrrrrrrrrrrrrrrrr";
const EXPIRED = "tg_live_eeeeeeeeeeeeeeeeeeeeeeee";
const EXPIRES_LATER = "tg_live_ffffffffffffffffffffffff";
const EXPIRES_NOW = "tg_live_nnnnnnnnnnnnnnnnnnnnnnnn";
const HASHED = "tg_live_hhhhhhhhhhhhhhhhhhhhhhhh";
const OTHER_ACCOUNT = "tg_live_oooooooooooooooooooooooo";
const LIMITED_A = "tg_live_limited_aaaaaaaaaaaaaaaa";
const LIMITED_B = "tg_live_limited_bbbbbbbbbbbbbbbb";
const SIDE = "tg_live_side_ssssssssssssssssssss";

const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");

const pricing = { inputPerMillion: 1, outputPerMillion: 1 };
const CONFIG = parseGatewayConfig({
  upstreams: [{ id: "local", baseUrl: "http://127.0.0.1:8000/v1" }],
  models: [
    { id: "mini", upstream: "local", upstreamModel: "a", runtime: "vllm", pricing },
    { id: "pro", upstream: "local", upstreamModel: "b", runtime: "vllm", pricing },
    { id: "reasoner", upstream: "local", upstreamModel: "c", runtime: "vllm", pricing },
  ],
  accounts: [
    {
      id: "acme",
      connections: [
        {
          id: "main",
          // Deliberately not alphabetical: the configured order is what callers see.
          models: ["pro", "mini"],
          defaultModel: "mini",
          policy: { defaultMaxOutputTokens: 256, maxOutputTokens: 2048 },
          keys: [
            { id: "live", secret: LIVE },
            { id: "revoked", secret: REVOKED, revoked: true },
            { id: "expired", secret: EXPIRED, expiresAt: "2025-05-31T23:59:59Z" },
            { id: "later", secret: EXPIRES_LATER, expiresAt: "2025-06-01T12:00:01Z" },
            { id: "now", secret: EXPIRES_NOW, expiresAt: "2025-06-01T14:00:00+02:00" },
            { id: "hashed", sha256: sha256(HASHED) },
          ],
        },
      ],
    },
    {
      id: "globex",
      connections: [
        {
          id: "research",
          models: ["reasoner"],
          defaultModel: "reasoner",
          keys: [{ id: "other", secret: OTHER_ACCOUNT }],
        },
      ],
    },
    {
      id: "initech",
      limits: { requestsPerMinute: 6 },
      connections: [
        {
          id: "limited",
          models: ["mini"],
          defaultModel: "mini",
          routes: ["chat", "models"],
          policy: { defaultMaxOutputTokens: 100, maxOutputTokens: 1000 },
          limits: {
            requestsPerMinute: 4,
            keyRequestsPerMinute: 3,
            tokensPerMinute: 1_000,
            routes: { models: { requestsPerMinute: 2 } },
          },
          keys: [
            { id: "limited-a", secret: LIMITED_A },
            { id: "limited-b", secret: LIMITED_B },
          ],
        },
        { id: "side", models: ["mini"], defaultModel: "mini", keys: [{ id: "side", secret: SIDE }] },
      ],
    },
  ],
});

const PRICES = new Map(CONFIG.models.map((m) => [m.id, m.pricing]));

let deps: AuthorizeDeps;
beforeEach(async () => {
  deps = { store: createMemoryKeyStore(), ledger: createMemoryLedger(), prices: PRICES };
  await importConfig(deps.store, CONFIG, new Date(NOW.getTime() - 86_400_000));
});

const run = (input: Partial<AuthorizeInput>, now = NOW) =>
  authorize(deps, { key: LIVE, model: "", route: "chat", ...input }, now);

async function refusal(p: Promise<unknown>): Promise<AuthError | "resolved"> {
  try {
    await p;
    return "resolved";
  } catch (err) {
    expect(err).toBeInstanceOf(AuthError);
    return err as AuthError;
  }
}

async function codeOf(p: Promise<unknown>): Promise<AuthErrorCode | "resolved"> {
  const r = await refusal(p);
  return r === "resolved" ? r : r.code;
}

describe("authorize: keys and policy", () => {
  it("resolves a valid key to its principal, the default model and the default cap", async () => {
    expect(await run({})).toEqual({
      accountId: "acme",
      connectionId: "main",
      keyId: "live",
      model: "mini",
      maxOutputTokens: 256,
      allowedModels: ["pro", "mini"],
      defaultModel: "mini",
      // No body size given: (16 + 256 output) tokens at 1 base unit per million, rounded up.
      quote: 1n,
    });
  });

  it("keeps the model and cap the caller asked for when policy allows them", async () => {
    const a = await run({ model: "pro", maxOutputTokens: 2048 });
    expect(a.model).toBe("pro");
    expect(a.maxOutputTokens).toBe(2048);
  });

  it("resolves keys of another account to that account's connection and default", async () => {
    const a = await run({ key: OTHER_ACCOUNT });
    expect(a).toMatchObject({
      accountId: "globex",
      connectionId: "research",
      keyId: "other",
      model: "reasoner",
    });
    // The fallback policy when the connection names none.
    expect(a.maxOutputTokens).toBe(1024);
  });

  it("refuses a missing key", async () => {
    expect(await codeOf(run({ key: "" }))).toBe("missing_api_key");
  });

  it("refuses an unknown key", async () => {
    expect(await codeOf(run({ key: "tg_live_not_a_key_we_issued_000" }))).toBe("invalid_api_key");
    // A key differing from a real one only in case is still unknown.
    expect(await codeOf(run({ key: LIVE.toUpperCase() }))).toBe("invalid_api_key");
  });

  it("refuses a revoked key", async () => {
    expect(await codeOf(run({ key: REVOKED }))).toBe("revoked_api_key");
  });

  it("refuses a key whose expiry has passed, and at the instant of expiry", async () => {
    expect(await codeOf(run({ key: EXPIRED }))).toBe("expired_api_key");
    expect(await codeOf(run({ key: EXPIRES_NOW }))).toBe("expired_api_key");
  });

  it("accepts a key that expires in the future, until it does, and says until when", async () => {
    const a = await run({ key: EXPIRES_LATER });
    expect(a.keyId).toBe("later");
    expect(a.keyValidUntil).toEqual(new Date("2025-06-01T12:00:01Z"));
    expect(await codeOf(run({ key: EXPIRES_LATER }, after(2)))).toBe("expired_api_key");
  });

  it("refuses a model outside the connection, even one that exists elsewhere", async () => {
    const err = await refusal(run({ model: "reasoner" }));
    expect(err).toMatchObject({ code: "model_not_allowed" });
    expect((err as AuthError).message).toContain("reasoner");
    expect(await codeOf(run({ model: "no-such-model" }))).toBe("model_not_allowed");
  });

  it("refuses an output cap above the policy maximum", async () => {
    const err = await refusal(run({ maxOutputTokens: 2049 }));
    expect(err).toMatchObject({ code: "output_cap_above_policy" });
    expect((err as AuthError).message).toContain("2048");
  });

  it("lists the models for the models route without checking a model or cap", async () => {
    const a = await run({ route: "models", model: "reasoner", maxOutputTokens: 1_000_000 });
    expect(a.allowedModels).toEqual(["pro", "mini"]);
    expect(a.defaultModel).toBe("mini");
    expect(a.keyId).toBe("live");
    expect(a.maxOutputTokens).toBeUndefined();
  });

  it("still refuses a bad key on the models route", async () => {
    expect(await codeOf(run({ route: "models", key: REVOKED }))).toBe("revoked_api_key");
    expect(await codeOf(run({ route: "models", key: "nope" }))).toBe("invalid_api_key");
  });

  it("accepts a key configured by its SHA-256 when given in clear text", async () => {
    expect((await run({ key: HASHED })).keyId).toBe("hashed");
    // The hash itself is not a key.
    expect(await codeOf(run({ key: sha256(HASHED) }))).toBe("invalid_api_key");
  });

  it("refuses a huge key as invalid", async () => {
    expect(await codeOf(run({ key: "x".repeat(10_000) }))).toBe("invalid_api_key");
    expect(await codeOf(run({ key: LIVE + "x".repeat(10_000) }))).toBe("invalid_api_key");
  });
});

describe("authorize: route policy", () => {
  it("lets a connection without a list call every route", async () => {
    for (const route of ["models", "chat", "completions", "responses", "think"] as const) {
      expect((await run({ key: SIDE, route })).keyId).toBe("side");
    }
  });

  it("refuses a route outside the connection's list with 403 route_not_allowed", async () => {
    for (const route of ["completions", "responses", "think"] as const) {
      const e = await refusal(run({ key: LIMITED_A, route }));
      expect(e).toMatchObject({ code: "route_not_allowed" });
      expect((e as AuthError).message).toContain(route);
    }
    expect((await run({ key: LIMITED_A, route: "chat" })).keyId).toBe("limited-a");
    expect((await run({ key: LIMITED_A, route: "models" })).keyId).toBe("limited-a");
  });

  it("refuses a call that names no route when the connection restricts routes", async () => {
    expect(await codeOf(run({ key: LIMITED_A, route: undefined }))).toBe("route_not_allowed");
    // An unrestricted connection takes it, as a model-running call.
    expect((await run({ route: undefined })).model).toBe("mini");
  });

  it("checks the key before the route: a revoked key is 401 on any route", async () => {
    await createAdmin({
      store: deps.store,
      publisher: { publish: async () => {} },
      knownModels: new Set(),
    }).revokeKey("limited-a", NOW);
    expect(await codeOf(run({ key: LIMITED_A, route: "think" }))).toBe("revoked_api_key");
  });
});

describe("authorize: rotation", () => {
  it("keeps a rotated key working for its grace period, then answers rotated_api_key", async () => {
    const admin = createAdmin({
      store: deps.store,
      publisher: { publish: async () => {} },
      knownModels: new Set(),
    });
    const { secret, key } = await admin.rotateKey({ keyId: "live", graceSeconds: 60 }, NOW);
    const old = await run({}, after(59));
    expect(old.keyId).toBe("live");
    expect(old.keyValidUntil).toEqual(after(60));
    expect((await run({ key: secret }, after(59))).keyId).toBe(key.keyId);
    expect(await codeOf(run({}, after(60)))).toBe("rotated_api_key");
    expect((await run({ key: secret }, after(60))).keyId).toBe(key.keyId);
  });
});

describe("authorize: rate limits", () => {
  const limited = (key: string, input: Partial<AuthorizeInput> = {}, now = NOW) =>
    run({ key, maxOutputTokens: 10, ...input }, now);

  it("refuses the request over a key's limit with 429 numbers, and admits it a minute later", async () => {
    for (let i = 0; i < 3; i++) await limited(LIMITED_A, {}, after(i));
    const err = await refusal(limited(LIMITED_A, {}, after(3)));
    expect(err).toMatchObject({
      code: "rate_limited",
      rateLimit: {
        scope: "key",
        unit: "requests",
        limit: 3,
        remaining: 0,
        retryAfterSeconds: 58,
        resetSeconds: 60,
      },
    });
    expect((err as AuthError).message).toContain("retry in 58 s");
    expect((await limited(LIMITED_A, {}, after(61))).keyId).toBe("limited-a");
  });

  it("reports the window closest to exhaustion on success", async () => {
    const a = await limited(LIMITED_A);
    // key: 2 of 3 left; connection: 3 of 4; account: 5 of 6; tokens: 990 of 1000.
    expect(a.rateLimit).toEqual({ scope: "key", unit: "requests", limit: 3, remaining: 2, resetSeconds: 61 });
    // No limit applies to this connection at all.
    expect((await run({})).rateLimit).toBeUndefined();
  });

  it("counts a refused request nowhere: the key's refusal leaves the connection's budget intact", async () => {
    for (let i = 0; i < 3; i++) await limited(LIMITED_A);
    for (let i = 0; i < 5; i++) expect(await codeOf(limited(LIMITED_A))).toBe("rate_limited");
    // The connection (4 per minute) has seen 3, so key B gets exactly one.
    await limited(LIMITED_B);
    expect(await refusal(limited(LIMITED_B))).toMatchObject({ rateLimit: { scope: "connection", limit: 4 } });
  });

  it("counts nothing for a request refused by policy", async () => {
    for (let i = 0; i < 10; i++) {
      expect(await codeOf(limited(LIMITED_A, { model: "pro" }))).toBe("model_not_allowed");
      expect(await codeOf(limited(LIMITED_A, { route: "think" }))).toBe("route_not_allowed");
      expect(await codeOf(limited(LIMITED_A, { maxOutputTokens: 5_000 }))).toBe("output_cap_above_policy");
    }
    for (let i = 0; i < 3; i++) await limited(LIMITED_A);
  });

  it("limits a route of the connection across its keys", async () => {
    await limited(LIMITED_A, { route: "models" });
    await limited(LIMITED_B, { route: "models" });
    expect(await refusal(limited(LIMITED_A, { route: "models" }))).toMatchObject({
      code: "rate_limited",
      rateLimit: { scope: "route", limit: 2 },
    });
    // Other routes are not held back by the models route's limit.
    await limited(LIMITED_A, { route: "chat" });
  });

  it("limits the account across its connections", async () => {
    for (let i = 0; i < 4; i++) await limited(i % 2 === 0 ? LIMITED_A : LIMITED_B, {}, after(i));
    await limited(SIDE);
    await limited(SIDE);
    expect(await refusal(limited(SIDE))).toMatchObject({ rateLimit: { scope: "account", limit: 6 } });
  });

  it("counts the input estimate plus the effective output cap against tokens per minute", async () => {
    // 1000 tokens per minute: 400 + 500 fits, then 100 more (the default cap, no estimate) fits.
    await limited(LIMITED_A, { maxOutputTokens: 500, estimatedInputTokens: 400 });
    await limited(LIMITED_B, { maxOutputTokens: undefined });
    const err = await refusal(limited(LIMITED_B, { maxOutputTokens: 1, estimatedInputTokens: 0 }));
    expect(err).toMatchObject({
      code: "rate_limited",
      rateLimit: { scope: "connection", unit: "tokens", remaining: 0 },
    });
  });

  it("refuses with 403 a request whose tokens could never fit the limit", async () => {
    const err = await refusal(limited(LIMITED_A, { maxOutputTokens: 900, estimatedInputTokens: 101 }));
    expect(err).toMatchObject({ code: "tokens_above_rate_limit" });
    expect((err as AuthError).message).toContain("1000");
    // …and it consumed nothing.
    for (let i = 0; i < 3; i++) await limited(LIMITED_A);
  });
});

describe("authorize: fan-out and check-only", () => {
  const limited = (key: string, input: Partial<AuthorizeInput> = {}, now = NOW) =>
    run({ key, maxOutputTokens: 10, ...input }, now);

  it("counts cap × sequences against tokens per minute", async () => {
    // 1000 tokens per minute: 10 sequences of 100 tokens fill it; another token does not fit.
    await limited(LIMITED_A, { maxOutputTokens: 100, outputSequences: 10, estimatedInputTokens: 0 });
    expect(await codeOf(limited(LIMITED_B, { maxOutputTokens: 1, estimatedInputTokens: 0 }))).toBe(
      "rate_limited",
    );
    expect(
      await codeOf(
        limited(LIMITED_A, { maxOutputTokens: 200, outputSequences: 6, estimatedInputTokens: 0 }, after(120)),
      ),
    ).toBe("tokens_above_rate_limit");
  });

  it("checks the key and the route but takes no rate-limit unit when asked to check only", async () => {
    for (let i = 0; i < 10; i++) {
      const a = await limited(LIMITED_A, { checkOnly: true });
      expect(a.keyId).toBe("limited-a");
      expect(a.reservationId).toBeUndefined();
    }
    expect(await codeOf(limited(LIMITED_A, { checkOnly: true, route: "think" }))).toBe("route_not_allowed");
    expect(await codeOf(run({ key: REVOKED, checkOnly: true }))).toBe("revoked_api_key");
    // The key's 3 requests per minute are all still there.
    for (let i = 0; i < 3; i++) await limited(LIMITED_A);
    expect(await codeOf(limited(LIMITED_A))).toBe("rate_limited");
  });
});

describe("authorize: a route that needs reasoning", () => {
  it("refuses a model that cannot reason before counting or holding anything", async () => {
    const reasoning = { ...deps, reasoningModels: new Set(["reasoner"]) };
    for (let i = 0; i < 5; i++) {
      const err = await refusal(
        authorize(reasoning, { key: LIMITED_A, model: "", route: "chat", requireReasoning: true }, NOW),
      );
      expect((err as AuthError).code).toBe("model_cannot_reason");
    }
    // The key's 3 requests a minute are untouched.
    for (let i = 0; i < 3; i++)
      await authorize(reasoning, { key: LIMITED_A, model: "", route: "chat", maxOutputTokens: 10 }, NOW);
    // A model that reasons passes.
    const ok = await authorize(
      reasoning,
      { key: OTHER_ACCOUNT, model: "", route: "think", requireReasoning: true },
      NOW,
    );
    expect(ok.model).toBe("reasoner");
  });
});

describe("authorize: model kinds", () => {
  it("refuses an embedding model off the embeddings route, and a chat model on it, before counting or holding anything", async () => {
    // "mini" plays the embedding model here.
    const kinds = { ...deps, embeddingModels: new Set(["mini"]) };
    for (let i = 0; i < 5; i++) {
      const chat = await refusal(authorize(kinds, { key: LIMITED_A, model: "mini", route: "chat" }, NOW));
      expect((chat as AuthError).code).toBe("model_kind_mismatch");
      expect((chat as AuthError).message).toContain("mini");
    }
    // The key's 3 requests a minute are untouched by the refusals.
    for (let i = 0; i < 3; i++) await authorize(deps, { key: LIMITED_A, model: "mini", route: "chat" }, NOW);
    expect(await codeOf(authorize(deps, { key: LIMITED_A, model: "mini", route: "chat" }, NOW))).toBe(
      "rate_limited",
    );
    const onEmbeddings = await refusal(
      authorize(
        kinds,
        { key: OTHER_ACCOUNT, model: "reasoner", route: "embeddings", maxOutputTokens: 0 },
        NOW,
      ),
    );
    expect((onEmbeddings as AuthError).code).toBe("model_kind_mismatch");
    // The embedding model passes on its route with no output cap: its quote is the input bound alone.
    const ok = await authorize(
      kinds,
      { key: SIDE, model: "mini", route: "embeddings", maxOutputTokens: 0, bodyBytes: 100, messageCount: 1 },
      NOW,
    );
    expect(ok.maxOutputTokens).toBe(0);
    expect(ok.quote).toBe(quoteOf(100, 1, 0, PRICES.get("mini")!));
  });
});
