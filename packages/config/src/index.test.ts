import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ConfigError } from "@tollgate/kit/config";
import { afterAll, describe, expect, it } from "vitest";
import { loadGatewayConfig, modelUpstreams, parseGatewayConfig, upstreamPolicy } from "./index.js";

const DEMO = fileURLToPath(new URL("../../../deploy/config/tollgate.yaml", import.meta.url));

/** A small valid document; tests copy and break it. */
function validDoc() {
  return {
    upstreams: [{ id: "local", baseUrl: "http://127.0.0.1:8000/v1" }],
    models: [
      {
        id: "mini",
        upstream: "local",
        upstreamModel: "qwen",
        runtime: "vllm",
        pricing: { inputPerMillion: 150000, outputPerMillion: 600000 },
      },
      {
        id: "pro",
        upstream: "local",
        upstreamModel: "llama",
        runtime: "vllm",
        pricing: { inputPerMillion: "2500000", outputPerMillion: "10000000" },
      },
    ],
    accounts: [
      {
        id: "acme",
        connections: [
          {
            id: "default",
            models: ["mini", "pro"],
            defaultModel: "mini",
            keys: [{ id: "k1", secret: "tg_dev_0123456789abcdef" }],
          },
        ],
      },
    ],
  };
}

function problemsOf(fn: () => unknown): string[] {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return [...(err as ConfigError).problems];
  }
  throw new Error("expected a ConfigError");
}

describe("loadGatewayConfig on the demo file", () => {
  it("loads the documented example", () => {
    const cfg = loadGatewayConfig(DEMO);
    expect(cfg.upstreams.map((u) => u.id)).toEqual(["demo"]);
    expect(cfg.upstreams[0]?.kind).toBe("openai-compatible");
    expect(cfg.models.map((m) => m.id)).toEqual([
      "tollgate-mini",
      "tollgate-pro",
      "tollgate-reasoner",
      "tollgate-embed-mini",
    ]);
    expect(cfg.models[0]?.kind).toBe("chat");
    expect(cfg.models[3]).toMatchObject({ kind: "embedding", dimensions: 256 });
    expect(cfg.models[3]?.pricing.outputPerMillion).toBe(0n);
    expect(cfg.models[0]?.pricing).toEqual({ inputPerMillion: 150000n, outputPerMillion: 600000n });
    expect(cfg.models[0]?.reasoning).toBe(false);
    expect(cfg.models[2]?.reasoning).toBe(true);
    expect(cfg.plans?.Premium?.default).toBe("tollgate-reasoner");
    const conn = cfg.accounts[0]?.connections[0];
    expect(conn?.defaultModel).toBe("tollgate-mini");
    expect(conn?.policy).toEqual({ defaultMaxOutputTokens: 256, maxOutputTokens: 4096 });
    expect(conn?.keys[0]).toMatchObject({ id: "demo-key", revoked: false });
  });
});

describe("parseGatewayConfig", () => {
  it("fills in defaults", () => {
    const cfg = parseGatewayConfig(validDoc());
    expect(cfg.resilience).toEqual({
      timeouts: { connectMs: 5_000, firstTokenMs: 60_000, idleMs: 30_000, totalMs: 120_000 },
      retry: { maxAttempts: 3, baseBackoffMs: 100, maxBackoffMs: 2_000 },
      cooldown: { failures: 5, windowMs: 10_000, durationMs: 30_000, maxRetryAfterMs: 60_000 },
    });
    expect(upstreamPolicy(cfg.resilience, cfg.upstreams[0]!)).toEqual({
      timeouts: cfg.resilience.timeouts,
      cooldown: cfg.resilience.cooldown,
    });
    expect(cfg.models[0]?.maxOutputTokens).toBe(4096);
    expect(cfg.accounts[0]?.connections[0]?.policy).toEqual({
      defaultMaxOutputTokens: 1024,
      maxOutputTokens: 4096,
    });
    expect(cfg.accounts[0]?.connections[0]?.keys[0]?.revoked).toBe(false);
  });

  it("accepts prices as integers or decimal strings, exactly", () => {
    const doc = validDoc();
    doc.models[1]!.pricing.inputPerMillion = "123456789012345678901234567890";
    const cfg = parseGatewayConfig(doc);
    expect(cfg.models[1]?.pricing.inputPerMillion).toBe(123456789012345678901234567890n);
    expect(cfg.models[1]?.pricing.outputPerMillion).toBe(10000000n);
  });

  it("accepts embedding models priced per input token, with their dimension", () => {
    const doc = validDoc() as unknown as { models: Array<Record<string, unknown>> };
    doc.models.push({
      id: "embed",
      upstream: "local",
      upstreamModel: "bge",
      runtime: "vllm",
      kind: "embedding",
      dimensions: 384,
      pricing: { inputPerMillion: 20000, outputPerMillion: 0 },
    });
    const cfg = parseGatewayConfig(doc);
    expect(cfg.models[0]?.kind).toBe("chat");
    expect(cfg.models[2]).toMatchObject({ kind: "embedding", dimensions: 384 });
  });

  it("accepts embeddings in a connection's routes and per-route limits", () => {
    const doc = validDoc();
    Object.assign(doc.accounts[0]!.connections[0]!, {
      routes: ["models", "embeddings"],
      limits: { routes: { embeddings: { requestsPerMinute: 60, tokensPerMinute: 100000 } } },
    });
    const conn = parseGatewayConfig(doc).accounts[0]?.connections[0];
    expect(conn?.routes).toEqual(["models", "embeddings"]);
    expect(conn?.limits?.routes?.embeddings).toEqual({ requestsPerMinute: 60, tokensPerMinute: 100000 });
  });

  it("refuses an embedding model with an output price, reasoning or on a paid plan", () => {
    const doc = validDoc() as unknown as { models: Array<Record<string, unknown>> } & Record<string, unknown>;
    doc.models.push({
      id: "embed",
      upstream: "local",
      upstreamModel: "bge",
      runtime: "vllm",
      kind: "embedding",
      reasoning: true,
      pricing: { inputPerMillion: 20000, outputPerMillion: 1 },
    });
    doc.models[0]!.dimensions = 64;
    doc.models[1]!.kind = "image";
    doc.plans = {
      Starter: { models: ["embed"], default: "embed" },
      Plus: { models: ["mini"], default: "mini" },
      Premium: { models: ["mini"], default: "mini" },
    };
    const text = problemsOf(() => parseGatewayConfig(doc)).join("\n");
    expect(text).toContain("models.2.pricing.outputPerMillion");
    expect(text).toContain("models.2.reasoning");
    expect(text).toContain("models.0.dimensions");
    expect(text).toContain("models.1.kind");
    expect(text).toContain('plans.Starter.models.0: "embed" is an embedding model');
  });

  it("accepts anthropic upstreams, and refuses an embedding model they would serve", () => {
    const doc = validDoc() as unknown as {
      upstreams: Array<Record<string, unknown>>;
      models: Array<Record<string, unknown>>;
    };
    doc.upstreams.push({
      id: "claude",
      kind: "anthropic",
      baseUrl: "https://api.anthropic.com",
      apiKeyEnv: "ANTHROPIC_API_KEY",
    });
    doc.models[1]!.upstream = "claude";
    const cfg = parseGatewayConfig(doc);
    expect(cfg.upstreams.map((u) => u.kind)).toEqual(["openai-compatible", "anthropic"]);
    doc.models.push({
      id: "embed",
      upstreams: [{ id: "local" }, { id: "claude" }],
      upstreamModel: "bge",
      runtime: "vllm",
      kind: "embedding",
      pricing: { inputPerMillion: 20000, outputPerMillion: 0 },
    });
    doc.upstreams.push({ id: "other", kind: "gemini", baseUrl: "https://example.com" });
    const text = problemsOf(() => parseGatewayConfig(doc)).join("\n");
    expect(text).toContain('models.2: embedding model served by anthropic upstream "claude"');
    expect(text).toContain("upstreams.2.kind");
  });

  it("accepts an accounts-free document (paid door only)", () => {
    const { accounts: _, ...doc } = validDoc();
    expect(parseGatewayConfig(doc).accounts).toEqual([]);
  });

  it("names every field-level problem at once", () => {
    const doc = validDoc() as unknown as {
      upstreams: Array<Record<string, unknown>>;
      models: Array<{ pricing: Record<string, unknown> }>;
      accounts: Array<{ connections: Array<{ keys: Array<Record<string, unknown>> }> }>;
    };
    doc.upstreams[0] = { id: "local", baseURL: "http://127.0.0.1:8000/v1" };
    doc.models[0]!.pricing["inputPerMillion"] = 0.5;
    doc.accounts[0]!.connections[0]!.keys[0]!["sha256"] = "a".repeat(64);
    const problems = problemsOf(() => parseGatewayConfig(doc, "tollgate.yaml"));
    const text = problems.join("\n");
    expect(text).toContain('Unrecognized key: "baseURL"');
    expect(text).toContain("tollgate.yaml.upstreams.0.baseUrl");
    expect(text).toContain("tollgate.yaml.models.0.pricing.inputPerMillion");
    expect(text).toMatch(
      /tollgate\.yaml\.accounts\.0\.connections\.0\.keys\.0: .*exactly one of secret or sha256/,
    );
  });

  it("refuses a key with neither secret nor sha256, and a short secret", () => {
    const doc = validDoc() as unknown as {
      accounts: Array<{ connections: Array<{ keys: Array<Record<string, unknown>> }> }>;
    };
    doc.accounts[0]!.connections[0]!.keys = [{ id: "none" }, { id: "short", secret: "tg_short" }];
    const text = problemsOf(() => parseGatewayConfig(doc)).join("\n");
    expect(text).toContain("accounts.0.connections.0.keys.0");
    expect(text).toContain("accounts.0.connections.0.keys.1.secret");
  });

  it("names every cross-reference problem at once", () => {
    const doc = validDoc();
    doc.models[1]!.upstream = "missing-upstream";
    const conn = doc.accounts[0]!.connections[0]!;
    conn.defaultModel = "not-listed";
    conn.models = ["mini", "ghost"];
    conn.keys.push({ id: "k1", secret: "tg_dev_fedcba9876543210" });
    const problems = problemsOf(() => parseGatewayConfig({ ...doc, models: [...doc.models, doc.models[0]] }));
    const text = problems.join("\n");
    expect(text).toContain('models.1.upstream: unknown upstream "missing-upstream"');
    expect(text).toContain('models: duplicate id "mini"');
    expect(text).toContain('accounts.0.connections.0.models.1: unknown model "ghost"');
    expect(text).toContain('accounts.0.connections.0.defaultModel: "not-listed" is not in its models');
    expect(text).toContain('keys: duplicate id "k1"');
    expect(problems).toHaveLength(5);
  });

  it("refuses a default output cap above the connection's maximum", () => {
    const doc = validDoc();
    Object.assign(doc.accounts[0]!.connections[0]!, {
      policy: { defaultMaxOutputTokens: 5000, maxOutputTokens: 4096 },
    });
    const text = problemsOf(() => parseGatewayConfig(doc)).join("\n");
    expect(text).toContain("policy.defaultMaxOutputTokens");
  });

  it("accepts rate limits and a route list, and leaves them unset (unlimited) by default", () => {
    expect(parseGatewayConfig(validDoc()).accounts[0]).not.toHaveProperty("limits");
    const doc = validDoc();
    Object.assign(doc.accounts[0]!, { limits: { requestsPerMinute: 600 } });
    Object.assign(doc.accounts[0]!.connections[0]!, {
      routes: ["chat", "models"],
      limits: {
        requestsPerMinute: 120,
        tokensPerMinute: 200000,
        keyRequestsPerMinute: 60,
        keyTokensPerMinute: 100000,
        routes: { chat: { requestsPerMinute: 30 }, think: { tokensPerMinute: 5000 } },
      },
    });
    const cfg = parseGatewayConfig(doc);
    expect(cfg.accounts[0]?.limits).toEqual({ requestsPerMinute: 600 });
    const conn = cfg.accounts[0]?.connections[0];
    expect(conn?.routes).toEqual(["chat", "models"]);
    expect(conn?.limits?.routes).toEqual({
      chat: { requestsPerMinute: 30 },
      think: { tokensPerMinute: 5000 },
    });
    expect(conn?.limits?.keyTokensPerMinute).toBe(100000);
  });

  it("refuses unknown routes, zero or fractional limits and misspelled limit fields", () => {
    const doc = validDoc();
    Object.assign(doc.accounts[0]!, { limits: { requestsPerMinute: 0 } });
    Object.assign(doc.accounts[0]!.connections[0]!, {
      routes: ["chat", "images"],
      limits: { tokensPerMinute: 1.5, rpm: 5, routes: { images: { requestsPerMinute: 1 } } },
    });
    const text = problemsOf(() => parseGatewayConfig(doc)).join("\n");
    expect(text).toContain("accounts.0.limits.requestsPerMinute");
    expect(text).toContain("accounts.0.connections.0.routes.1");
    expect(text).toContain("accounts.0.connections.0.limits.tokensPerMinute");
    expect(text).toContain('Unrecognized key: "rpm"');
    expect(text).toContain("accounts.0.connections.0.limits.routes");
  });

  it("reads budgets of connections and keys as exact base units, the calendar month by default", () => {
    const doc = validDoc();
    Object.assign(doc.accounts[0]!.connections[0]!, {
      budget: { amount: "9007199254740991" },
      keys: [
        { id: "k1", secret: "tg_dev_0123456789abcdef", budget: { amount: 5000000, period: "day" } },
        { id: "k2", secret: "tg_dev_0123456789abcdeg", budget: { amount: 7, period: { days: 30 } } },
        { id: "k3", secret: "tg_dev_0123456789abcdeh" },
      ],
    });
    const conn = parseGatewayConfig(doc).accounts[0]?.connections[0];
    expect(conn?.budget).toEqual({ amount: 9007199254740991n, period: "month" });
    expect(conn?.keys.map((k) => k.budget)).toEqual([
      { amount: 5000000n, period: "day" },
      { amount: 7n, period: { days: 30 } },
      undefined,
    ]);
    expect(parseGatewayConfig(validDoc()).accounts[0]?.connections[0]).not.toHaveProperty("budget");
  });

  it("refuses negative, fractional or too large budgets and unknown periods", () => {
    const doc = validDoc();
    Object.assign(doc.accounts[0]!.connections[0]!, {
      budget: { amount: "9007199254740992", period: "year" },
      keys: [
        { id: "k1", secret: "tg_dev_0123456789abcdef", budget: { amount: -1 } },
        { id: "k2", secret: "tg_dev_0123456789abcdeg", budget: { amount: 1.5, period: { days: 0 } } },
      ],
    });
    const text = problemsOf(() => parseGatewayConfig(doc)).join("\n");
    expect(text).toContain("accounts.0.connections.0.budget.amount");
    expect(text).toContain("accounts.0.connections.0.budget.period");
    expect(text).toContain("accounts.0.connections.0.keys.0.budget.amount");
    expect(text).toContain("accounts.0.connections.0.keys.1.budget.amount");
    expect(text).toContain("accounts.0.connections.0.keys.1.budget.period");
  });

  it("accepts any subset of the three plans", () => {
    const cfg = parseGatewayConfig({ ...validDoc(), plans: { Plus: { models: ["mini"], default: "mini" } } });
    expect(Object.keys(cfg.plans ?? {})).toEqual(["Plus"]);
    expect(cfg.plans?.Starter).toBeUndefined();
  });

  it("turns the paid door off with no plans, absent or empty", () => {
    expect(parseGatewayConfig(validDoc()).plans).toBeUndefined();
    expect(parseGatewayConfig({ ...validDoc(), plans: {} }).plans).toBeUndefined();
  });

  it("still refuses a plan name outside Starter, Plus and Premium", () => {
    const text = problemsOf(() =>
      parseGatewayConfig({ ...validDoc(), plans: { Gold: { models: ["mini"], default: "mini" } } }),
    ).join("\n");
    expect(text).toContain("plans");
    expect(text).toContain("Gold");
  });

  it("checks plans against the models", () => {
    const plans = {
      Starter: { models: ["mini"], default: "mini" },
      Plus: { models: ["mini", "nope"], default: "mini" },
      Premium: { models: ["mini", "pro"], default: "absent" },
    };
    const text = problemsOf(() => parseGatewayConfig({ ...validDoc(), plans })).join("\n");
    expect(text).toContain('plans.Plus.models.1: unknown model "nope"');
    expect(text).toContain('plans.Premium.default: "absent" is not in its models');
  });
});

describe("upstreams of a model and their resilience", () => {
  it("reads `upstream` as the one-upstream shorthand of `upstreams`", () => {
    const cfg = parseGatewayConfig(validDoc());
    expect(modelUpstreams(cfg.models[0]!)).toEqual([{ id: "local", priority: 0, weight: 1 }]);
  });

  it("reads several upstreams with priority and weight, defaulting both, each with its own model id if it names one", () => {
    const doc = validDoc() as unknown as {
      upstreams: Array<Record<string, unknown>>;
      models: Array<Record<string, unknown>>;
    };
    doc.upstreams.push({ id: "backup", baseUrl: "http://127.0.0.1:8001/v1" });
    delete doc.models[0]!.upstream;
    doc.models[0]!.upstreams = [
      { id: "local", weight: 3 },
      { id: "backup", priority: 1, upstreamModel: "vendor/qwen-7b" },
    ];
    const cfg = parseGatewayConfig(doc);
    expect(modelUpstreams(cfg.models[0]!)).toEqual([
      { id: "local", priority: 0, weight: 3 },
      { id: "backup", priority: 1, weight: 1, upstreamModel: "vendor/qwen-7b" },
    ]);
  });

  it("refuses both forms at once, neither, unknown or repeated upstreams and zero weights", () => {
    const doc = validDoc() as unknown as { models: Array<Record<string, unknown>> };
    doc.models[0]!.upstreams = [{ id: "local" }];
    delete doc.models[1]!.upstream;
    const both = doc.models[0]!;
    const text = problemsOf(() =>
      parseGatewayConfig({
        ...doc,
        models: [
          both,
          doc.models[1],
          { ...doc.models[1], id: "x", upstreams: [{ id: "local" }, { id: "local" }, { id: "gone" }] },
          { ...doc.models[1], id: "y", upstreams: [{ id: "local", weight: 0 }] },
        ],
      }),
    ).join("\n");
    expect(text).toContain("models.0: give exactly one of upstream or upstreams");
    expect(text).toContain("models.1: give exactly one of upstream or upstreams");
    expect(text).toContain('models.2.upstreams: duplicate id "local"');
    expect(text).toContain('models.2.upstreams.2.id: unknown upstream "gone"');
    expect(text).toContain("models.3.upstreams.0.weight");
  });

  it("lets an upstream override the gateway's timeouts and cooldown, and keeps timeoutMs as total", () => {
    const doc = {
      ...validDoc(),
      resilience: {
        timeouts: { connectMs: 1_000, firstTokenMs: 20_000 },
        retry: { maxAttempts: 2 },
        cooldown: { failures: 3, durationMs: 5_000 },
      },
      upstreams: [
        { id: "local", baseUrl: "http://127.0.0.1:8000/v1", timeoutMs: 9_000, cooldown: { windowMs: 1_000 } },
        { id: "other", baseUrl: "http://127.0.0.1:8001/v1", timeoutMs: 9_000, timeouts: { totalMs: 7_000 } },
      ],
    };
    const cfg = parseGatewayConfig(doc);
    expect(cfg.resilience.retry).toEqual({ maxAttempts: 2, baseBackoffMs: 100, maxBackoffMs: 2_000 });
    expect(upstreamPolicy(cfg.resilience, cfg.upstreams[0]!)).toEqual({
      timeouts: { connectMs: 1_000, firstTokenMs: 20_000, idleMs: 30_000, totalMs: 9_000 },
      cooldown: { failures: 3, windowMs: 1_000, durationMs: 5_000, maxRetryAfterMs: 60_000 },
    });
    expect(upstreamPolicy(cfg.resilience, cfg.upstreams[1]!).timeouts.totalMs).toBe(7_000);
  });

  it("refuses unknown resilience fields, zero timeouts and a base backoff above the maximum", () => {
    const text = problemsOf(() =>
      parseGatewayConfig({
        ...validDoc(),
        resilience: {
          timeouts: { connectMs: 0 },
          retry: { maxAttempts: 0, baseBackoffMs: 5_000, maxBackoffMs: 1_000 },
          breaker: {},
        },
        upstreams: [{ id: "local", baseUrl: "http://127.0.0.1:8000/v1", cooldown: { failures: 0 } }],
      }),
    ).join("\n");
    expect(text).toContain("resilience.timeouts.connectMs");
    expect(text).toContain("resilience.retry.maxAttempts");
    expect(text).toContain('Unrecognized key: "breaker"');
    expect(text).toContain("upstreams.0.cooldown.failures");
    // The backoff check runs once the fields themselves are valid.
    const order = problemsOf(() =>
      parseGatewayConfig({
        ...validDoc(),
        resilience: { retry: { baseBackoffMs: 5_000, maxBackoffMs: 1_000 } },
      }),
    ).join("\n");
    expect(order).toContain("baseBackoffMs is above maxBackoffMs");
  });
});

describe("loadGatewayConfig errors", () => {
  const dir = mkdtempSync(join(tmpdir(), "tollgate-config-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("names the path of a missing file", () => {
    const path = join(dir, "absent.yaml");
    const problems = problemsOf(() => loadGatewayConfig(path));
    expect(problems).toHaveLength(1);
    expect(problems[0]).toContain(path);
    expect(problems[0]).toContain("ENOENT");
  });

  it("names the path of a file that is not YAML", () => {
    const path = join(dir, "broken.yaml");
    writeFileSync(path, "upstreams:\n  - id: a\n    baseUrl: [unclosed\n");
    const problems = problemsOf(() => loadGatewayConfig(path));
    expect(problems).toHaveLength(1);
    expect(problems[0]).toContain(path);
    expect(problems[0]).toContain("not valid YAML");
  });

  it("prefixes validation problems with the path", () => {
    const path = join(dir, "empty-models.yaml");
    writeFileSync(path, "upstreams:\n  - id: a\n    baseUrl: http://a/v1\nmodels: []\n");
    const problems = problemsOf(() => loadGatewayConfig(path));
    expect(problems.some((p) => p.startsWith(`${path}.models`))).toBe(true);
  });
});

describe("parseGatewayConfig reports schema and cross-reference problems together", () => {
  it("names a misspelled field and an unknown upstream in one error", () => {
    const doc = {
      upstreams: [{ id: "u", baseURL: "http://x/v1" }],
      models: [
        {
          id: "m",
          upstream: "nope",
          upstreamModel: "x",
          runtime: "vllm",
          pricing: { inputPerMillion: 1, outputPerMillion: 1 },
        },
      ],
      accounts: [{ id: "a", connections: [{ id: "c", models: ["m"], defaultModel: "m2" }] }],
    };
    let problems: readonly string[] = [];
    try {
      parseGatewayConfig(doc);
    } catch (err) {
      problems = (err as ConfigError).problems;
    }
    expect(problems.some((p) => p.includes("baseURL"))).toBe(true);
    expect(problems.some((p) => p.includes('unknown upstream "nope"'))).toBe(true);
    expect(problems.some((p) => p.includes('"m2" is not in its models'))).toBe(true);
  });
});
