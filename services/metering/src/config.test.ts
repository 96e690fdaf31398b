import { ConfigError } from "@tollgate/kit/config";
import { describe, expect, it } from "vitest";
import { loadConfig as load } from "./config.js";

/** Internal authentication has its own tests (packages/kit/src/credentials.test.ts); off here. */
const loadConfig = (env: NodeJS.ProcessEnv) => load({ INTERNAL_AUTH: "off", ...env });

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
      grpcHost: "127.0.0.1",
      internalAuth: expect.objectContaining({ mode: "off" }),
      grpcPort: 50054,
      logLevel: "info",
      shutdownTimeoutMs: 25_000,
      natsUrl: "nats://n:4222",
      natsNamespace: "",
      natsStreamReplicas: 1,
      redisUrl: "redis://r:6379",
      redisPrefix: "tollgate:",
      metricsHost: "127.0.0.1",
      metricsPort: 9054,
      authPolicyAddr: "127.0.0.1:50051",
      batchMaxEvents: 256,
      batchLingerMs: 100,
    });
    expect(
      loadConfig({ NATS_URL: "n", REDIS_URL: "r", AUTH_POLICY_ADDR: "auth-policy:50051" }).authPolicyAddr,
    ).toBe("auth-policy:50051");
  });

  it("commits paid holds with mpp-payment only when MPP_PAYMENT_ADDR names it", () => {
    const base = { NATS_URL: "n", REDIS_URL: "r" };
    expect(loadConfig(base)).not.toHaveProperty("mppPaymentAddr");
    expect(loadConfig({ ...base, MPP_PAYMENT_ADDR: "off" })).not.toHaveProperty("mppPaymentAddr");
    expect(loadConfig({ ...base, MPP_PAYMENT_ADDR: "mpp-payment:50052" }).mppPaymentAddr).toBe(
      "mpp-payment:50052",
    );
  });

  it("reads the batch size and linger, within bounds", () => {
    const c = loadConfig({ NATS_URL: "n", REDIS_URL: "r", BATCH_MAX_EVENTS: "64", BATCH_LINGER_MS: "0" });
    expect([c.batchMaxEvents, c.batchLingerMs]).toEqual([64, 0]);
    expect(() => loadConfig({ NATS_URL: "n", REDIS_URL: "r", BATCH_MAX_EVENTS: "1001" })).toThrow(
      ConfigError,
    );
  });

  it("takes a NATS server list, the stream's replicas and a Redis Cluster", () => {
    const c = loadConfig({
      NATS_SERVERS: "nats://a:4222, nats://b:4222,nats://c:4222",
      NATS_STREAM_REPLICAS: "3",
      REDIS_URL: "redis://:pw@redis:6379",
      REDIS_CLUSTER_NODES: "r0:6379,r1:6379",
    });
    expect(c.natsUrl).toBe("nats://a:4222,nats://b:4222,nats://c:4222");
    expect(c.natsStreamReplicas).toBe(3);
    expect(c.redisUrl).toBe("redis+cluster://:pw@r0:6379,r1:6379");
    expect(() => loadConfig({ NATS_URL: "n", REDIS_CLUSTER_NODES: "r0" })).toThrow(/REDIS_CLUSTER_NODES/);
  });
});
