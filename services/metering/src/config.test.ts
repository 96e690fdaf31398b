import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { loadConfig } from "./config.js";

describe("loadConfig", () => {
  it("names every missing required variable at once", () => {
    let err: unknown;
    try {
      loadConfig({ GRPC_PORT: "not a port" });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    const problems = (err as ConfigError).problems.join("\n");
    expect(problems).toContain("NATS_URL");
    expect(problems).toContain("REDIS_URL");
    expect(problems).toContain("GRPC_PORT");
  });

  it("fills in the defaults", () => {
    expect(
      loadConfig({ NATS_URL: "nats://n:4222", REDIS_URL: "redis://r:6379", NATS_NAMESPACE: "" }),
    ).toEqual({
      grpcHost: "0.0.0.0",
      grpcPort: 50054,
      logLevel: "info",
      natsUrl: "nats://n:4222",
      natsNamespace: "",
      redisUrl: "redis://r:6379",
      redisPrefix: "tollgate:",
      metricsHost: "0.0.0.0",
      metricsPort: 9054,
      authPolicyAddr: "127.0.0.1:50051",
    });
    expect(
      loadConfig({ NATS_URL: "n", REDIS_URL: "r", AUTH_POLICY_ADDR: "auth-policy:50051" }).authPolicyAddr,
    ).toBe("auth-policy:50051");
  });
});
