import { createHash } from "node:crypto";
import { parseGatewayConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { createConfigKeyStore } from "../adapters/config-key-store.js";
import { type AuthorizeInput, authorize } from "./authorize.js";
import { AuthError, type AuthErrorCode } from "./errors.js";

const NOW = new Date("2025-06-01T12:00:00Z");

const LIVE = "tg_live_aaaaaaaaaaaaaaaaaaaaaaaa";
const REVOKED = "tg_live_rrrrrrrrrrrrrrrrrrrrrrrr";
const EXPIRED = "tg_live_eeeeeeeeeeeeeeeeeeeeeeee";
const EXPIRES_LATER = "tg_live_ffffffffffffffffffffffff";
const EXPIRES_NOW = "tg_live_nnnnnnnnnnnnnnnnnnnnnnnn";
const HASHED = "tg_live_hhhhhhhhhhhhhhhhhhhhhhhh";
const OTHER_ACCOUNT = "tg_live_oooooooooooooooooooooooo";

const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");

const pricing = { inputPerMillion: 1, outputPerMillion: 1 };
const store = createConfigKeyStore(
  parseGatewayConfig({
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
    ],
  }),
);

const run = (input: Partial<AuthorizeInput>, now = NOW) =>
  authorize(store, { key: LIVE, model: "", runsModel: true, ...input }, now);

async function codeOf(p: Promise<unknown>): Promise<AuthErrorCode | "resolved"> {
  try {
    await p;
    return "resolved";
  } catch (err) {
    expect(err).toBeInstanceOf(AuthError);
    return (err as AuthError).code;
  }
}

describe("authorize", () => {
  it("resolves a valid key to its principal, the default model and the default cap", async () => {
    expect(await run({})).toEqual({
      accountId: "acme",
      connectionId: "main",
      keyId: "live",
      model: "mini",
      maxOutputTokens: 256,
      allowedModels: ["pro", "mini"],
      defaultModel: "mini",
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

  it("accepts a key that expires in the future, until it does", async () => {
    expect((await run({ key: EXPIRES_LATER })).keyId).toBe("later");
    expect(await codeOf(run({ key: EXPIRES_LATER }, new Date("2025-06-01T12:00:02Z")))).toBe(
      "expired_api_key",
    );
  });

  it("refuses a model outside the connection, even one that exists elsewhere", async () => {
    const err = await run({ model: "reasoner" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AuthError);
    expect((err as AuthError).code).toBe("model_not_allowed");
    expect((err as AuthError).message).toContain("reasoner");
    expect(await codeOf(run({ model: "no-such-model" }))).toBe("model_not_allowed");
  });

  it("refuses an output cap above the policy maximum", async () => {
    const err = await run({ maxOutputTokens: 2049 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AuthError);
    expect((err as AuthError).code).toBe("output_cap_above_policy");
    expect((err as AuthError).message).toContain("2048");
  });

  it("lists the models for the models route without checking a model or cap", async () => {
    const a = await run({ runsModel: false, model: "reasoner", maxOutputTokens: 1_000_000 });
    expect(a.allowedModels).toEqual(["pro", "mini"]);
    expect(a.defaultModel).toBe("mini");
    expect(a.keyId).toBe("live");
    expect(a.maxOutputTokens).toBeUndefined();
  });

  it("still refuses a bad key on the models route", async () => {
    expect(await codeOf(run({ runsModel: false, key: REVOKED }))).toBe("revoked_api_key");
    expect(await codeOf(run({ runsModel: false, key: "nope" }))).toBe("invalid_api_key");
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
