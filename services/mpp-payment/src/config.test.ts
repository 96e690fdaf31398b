import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError } from "@tollgate/kit/config";
import { privateKeyToAccount } from "viem/accounts";
import { describe, expect, it } from "vitest";
import { loadConfig as load } from "./config.js";

/** Internal authentication has its own tests (packages/kit/src/credentials.test.ts); off here. */
const loadConfig = (env: NodeJS.ProcessEnv) => load({ INTERNAL_AUTH: "off", ...env });

const dir = mkdtempSync(join(tmpdir(), "mpp-payment-config-"));
const KEY = "0x0e83644898daf21f4eced55d6afa70f290a3630935d73f3f41611fae3eb0f099";
const SECRET = "a-secret-that-is-long-enough-0123456789";

function gatewayFile(withPlans = true): string {
  const path = join(dir, `tollgate-${withPlans}.yaml`);
  writeFileSync(
    path,
    JSON.stringify({
      upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:9/v1" }],
      models: [
        {
          id: "m",
          upstream: "u",
          upstreamModel: "m",
          runtime: "vllm",
          pricing: { inputPerMillion: 1, outputPerMillion: 2 },
        },
      ],
      ...(withPlans
        ? {
            plans: {
              Starter: { models: ["m"], default: "m" },
              Plus: { models: ["m"], default: "m" },
              Premium: { models: ["m"], default: "m" },
            },
          }
        : {}),
    }),
  );
  return path;
}

function problemsOf(env: NodeJS.ProcessEnv): string {
  try {
    loadConfig(env);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as ConfigError).problems.join("\n");
  }
  throw new Error("expected a ConfigError");
}

describe("loadConfig", () => {
  it("names every bad or missing key at once, never a secret's value", () => {
    const problems = problemsOf({
      GRPC_PORT: "not a port",
      MPP_SECRET: "short-secret-value",
      TEMPO_CHAIN_ID: "-1",
      TEMPO_RPC_TIMEOUT_MS: "0",
      MPP_CURRENCY: "nope",
      MPP_PAYER_ALLOWLIST: "0x12",
      MPP_VOUCHER_BUCKET: "0",
      MPP_PAYEE_KEY: "0xnot-a-key",
    });
    for (const key of [
      "TOLLGATE_CONFIG",
      "TEMPO_RPC_URL",
      "GRPC_PORT",
      "MPP_SECRET",
      "TEMPO_CHAIN_ID",
      "TEMPO_RPC_TIMEOUT_MS",
      "MPP_CURRENCY",
      "MPP_PAYER_ALLOWLIST",
      "MPP_VOUCHER_BUCKET",
      "MPP_PAYEE_KEY",
    ]) {
      expect(problems).toContain(key);
    }
    expect(problems).not.toContain("short-secret-value");
    expect(problems).not.toContain("0xnot-a-key");
  });

  it("requires a secret, and a recipient or payee key, and plans in the configuration", () => {
    const problems = problemsOf({
      TOLLGATE_CONFIG: gatewayFile(false),
      TEMPO_RPC_URL: "http://127.0.0.1:8545",
    });
    expect(problems).toContain("MPP_SECRET: required");
    expect(problems).toContain("MPP_RECIPIENT: required unless MPP_PAYEE_KEY");
    expect(problems).toContain("plans: required");
  });

  it("refuses a secret given twice and a recipient that is not the payee key's address", () => {
    const problems = problemsOf({
      TOLLGATE_CONFIG: gatewayFile(),
      TEMPO_RPC_URL: "http://127.0.0.1:8545",
      MPP_SECRET: SECRET,
      MPP_SECRET_FILE: "/nonexistent",
      MPP_PAYEE_KEY: KEY,
      MPP_RECIPIENT: "0x0000000000000000000000000000000000000001",
    });
    expect(problems).toContain("set MPP_SECRET or MPP_SECRET_FILE, not both");
    expect(problems).toContain("MPP_RECIPIENT: differs from the payee key's address");
  });

  it("reads secrets from files, derives the recipient from the payee key and fills in the defaults", () => {
    const secretFile = join(dir, "secret");
    const keyFile = join(dir, "payee-key");
    writeFileSync(secretFile, `${SECRET}\n`);
    writeFileSync(keyFile, `${KEY.slice(2)}\n`);
    const config = loadConfig({
      TOLLGATE_CONFIG: gatewayFile(),
      TEMPO_RPC_URL: "http://127.0.0.1:8545",
      MPP_SECRET_FILE: secretFile,
      MPP_PAYEE_KEY_FILE: keyFile,
      MPP_PAYER_ALLOWLIST:
        "0x4a1Ba38C07f6dE670D6C1E730f269acfed2a11e0, 0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e",
    });
    const { gateway, ...rest } = config;
    expect(gateway.plans?.Starter?.default).toBe("m");
    expect(rest).toEqual({
      grpcHost: "127.0.0.1",
      internalAuth: expect.objectContaining({ mode: "off" }),
      grpcPort: 50052,
      logLevel: "info",
      shutdownTimeoutMs: 25_000,
      redisPrefix: "tollgate:",
      secret: SECRET,
      realm: "tollgate",
      tempoRpcUrl: "http://127.0.0.1:8545",
      rpcTimeoutMs: 5_000,
      chainId: 4217,
      currency: "0x20C000000000000000000000b9537d11c60E8b50",
      escrow: "0x4d50500000000000000000000000000000000000",
      payeeKey: KEY,
      recipient: privateKeyToAccount(KEY).address,
      voucherBucket: 1_000_000n,
      suggestedDeposit: 5_000_000n,
      challengeTtlSeconds: 300,
      payerAllowlist: [
        "0x4a1Ba38C07f6dE670D6C1E730f269acfed2a11e0",
        "0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e",
      ],
      maxCredentialBytes: 8_192,
      settleIntervalSeconds: 60,
      reservationTtlSeconds: 300,
      metricsHost: "127.0.0.1",
      metricsPort: 9052,
    });
  });

  it("runs without a payee key when a recipient is given, and with Redis when REDIS_URL is set", () => {
    const config = loadConfig({
      TOLLGATE_CONFIG: gatewayFile(),
      TEMPO_RPC_URL: "http://127.0.0.1:8545",
      MPP_SECRET: SECRET,
      MPP_RECIPIENT: "0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e",
      REDIS_URL: "redis://127.0.0.1:6379",
      MPP_SETTLE_INTERVAL_SECONDS: "0",
    });
    expect(config).toMatchObject({
      recipient: "0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e",
      redisUrl: "redis://127.0.0.1:6379",
      settleIntervalSeconds: 0,
    });
    expect(config.payeeKey).toBeUndefined();
  });
});
