import { fileURLToPath } from "node:url";
import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { loadConfig as load } from "./config.js";

/** Internal authentication has its own tests (packages/kit/src/credentials.test.ts); off here. */
const loadConfig = (env: NodeJS.ProcessEnv) => load({ INTERNAL_AUTH: "off", ...env });

const DEMO = fileURLToPath(new URL("../../../deploy/config/tollgate.yaml", import.meta.url));

describe("loadConfig", () => {
  it("runs in memory with defaults when only the configuration file is given", () => {
    const c = loadConfig({ TOLLGATE_CONFIG: DEMO });
    expect(c).toMatchObject({
      grpcPort: 50051,
      redisPrefix: "tollgate:",
      natsNamespace: "",
      rotationGraceSeconds: 86_400,
      reservationTtlSeconds: 600,
      settlementWindowSeconds: 7 * 86_400,
      shutdownTimeoutMs: 25_000,
    });
    expect(c.redisUrl).toBeUndefined();
    expect(c.natsUrl).toBeUndefined();
    expect(c.gateway.accounts[0]?.id).toBe("demo");
  });

  it("takes Redis, NATS and the rotation grace from the environment, empty meaning unset", () => {
    const c = loadConfig({
      TOLLGATE_CONFIG: DEMO,
      REDIS_URL: "redis://r:6379",
      REDIS_PREFIX: "t1:",
      NATS_URL: "",
      NATS_NAMESPACE: "ns",
      KEY_ROTATION_GRACE_SECONDS: "3600",
      SHUTDOWN_TIMEOUT_SECONDS: "20",
    });
    expect(c).toMatchObject({
      redisUrl: "redis://r:6379",
      redisPrefix: "t1:",
      natsNamespace: "ns",
      rotationGraceSeconds: 3_600,
      shutdownTimeoutMs: 20_000,
    });
    expect(c.natsUrl).toBeUndefined();
  });

  it("takes the reservation bounds and refuses a settlement window shorter than a hold", () => {
    const c = loadConfig({
      TOLLGATE_CONFIG: DEMO,
      RESERVATION_TTL_SECONDS: "900",
      SETTLEMENT_WINDOW_SECONDS: "86400",
    });
    expect(c).toMatchObject({ reservationTtlSeconds: 900, settlementWindowSeconds: 86_400 });
    expect(() =>
      loadConfig({
        TOLLGATE_CONFIG: DEMO,
        RESERVATION_TTL_SECONDS: "7200",
        SETTLEMENT_WINDOW_SECONDS: "3600",
      }),
    ).toThrow(/SETTLEMENT_WINDOW_SECONDS/);
    expect(() => loadConfig({ TOLLGATE_CONFIG: DEMO, RESERVATION_TTL_SECONDS: "0" })).toThrow(
      /RESERVATION_TTL_SECONDS/,
    );
  });

  it("names every bad variable at once", () => {
    try {
      loadConfig({ GRPC_PORT: "x", KEY_ROTATION_GRACE_SECONDS: String(31 * 86_400) });
      expect.unreachable();
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      const text = (err as ConfigError).problems.join(" ");
      expect(text).toContain("TOLLGATE_CONFIG");
      expect(text).toContain("GRPC_PORT");
      expect(text).toContain("KEY_ROTATION_GRACE_SECONDS");
    }
  });
});
