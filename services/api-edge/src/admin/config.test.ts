import { fileURLToPath } from "node:url";
import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { loadConfig as load } from "../config.js";

/** Internal authentication has its own tests (packages/kit/src/credentials.test.ts); off here. */
const loadConfig = (env: NodeJS.ProcessEnv) => load({ INTERNAL_AUTH: "off", ...env });

describe("api-edge config: the admin API", () => {
  it("stays off without ADMIN_TOKEN, and with an empty one", () => {
    expect(loadConfig({}).admin).toBeUndefined();
    expect(loadConfig({ ADMIN_TOKEN: "", ADMIN_PORT: "9999" }).admin).toBeUndefined();
  });

  it("runs on 127.0.0.1:8081 against metering on 127.0.0.1:50054 by default", () => {
    expect(loadConfig({ ADMIN_TOKEN: "0123456789abcdef" }).admin).toEqual({
      host: "127.0.0.1",
      port: 8081,
      token: "0123456789abcdef",
      meteringAddr: "127.0.0.1:50054",
    });
    expect(
      loadConfig({
        ADMIN_TOKEN: "0123456789abcdef",
        ADMIN_HOST: "0.0.0.0",
        ADMIN_PORT: "9091",
        METERING_ADDR: "metering:50054",
      }).admin,
    ).toEqual({ host: "0.0.0.0", port: 9091, token: "0123456789abcdef", meteringAddr: "metering:50054" });
  });

  it("refuses a short token without printing it", () => {
    let error: unknown;
    try {
      loadConfig({ ADMIN_TOKEN: "short-secret" });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as Error).message).toContain("ADMIN_TOKEN");
    expect((error as Error).message).not.toContain("short-secret");
  });
});

describe("api-edge config: the public port's limits", () => {
  it("has safe defaults", () => {
    expect(loadConfig({}).limits).toEqual({
      bodyLimitBytes: 4 * 1024 * 1024,
      maxJsonDepth: 64,
      maxMessages: 2048,
      maxHeaderBytes: 16_384,
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 60_000,
      connectionTimeoutMs: 180_000,
      maxConnections: 10_000,
    });
  });

  it("reads each from its variable and refuses a headers timeout above the request timeout", () => {
    expect(
      loadConfig({ MAX_JSON_DEPTH: "8", MAX_MESSAGES: "10", MAX_CONNECTIONS: "0", HEADERS_TIMEOUT_MS: "500" })
        .limits,
    ).toMatchObject({ maxJsonDepth: 8, maxMessages: 10, maxConnections: 0, headersTimeoutMs: 500 });
    expect(() => loadConfig({ HEADERS_TIMEOUT_MS: "70000" })).toThrow(ConfigError);
    expect(() => loadConfig({ MAX_JSON_DEPTH: "0" })).toThrow(/MAX_JSON_DEPTH/);
  });
});

describe("api-edge config: the OpenAPI document's prices", () => {
  it("reads the plans and prices of TOLLGATE_CONFIG, and none without it", () => {
    expect(loadConfig({}).offer).toBeUndefined();
    const path = fileURLToPath(new URL("../../../../deploy/config/tollgate.yaml", import.meta.url));
    const offer = loadConfig({ TOLLGATE_CONFIG: path }).offer;
    expect(Object.keys(offer?.plans ?? {})).toEqual(["Starter", "Plus", "Premium"]);
    expect(offer?.models.find((m) => m.id === "tollgate-mini")?.pricing.inputPerMillion).toBe(150_000n);
    expect(() => loadConfig({ TOLLGATE_CONFIG: "/nonexistent/tollgate.yaml" })).toThrow(ConfigError);
  });
});
