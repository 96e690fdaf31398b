import { type GatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { type Client, createClient, GrpcStatus, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { connectRedis, quitRedis } from "@tollgate/kit/redis";
import { AuthService, BudgetPeriod, Route } from "@tollgate/proto/auth";
import { privateRedis, type RedisFixture } from "@tollgate/testkit/fixtures";
import { captureLogs, type LogCapture } from "@tollgate/testkit/logs";
import { afterEach, describe, expect, it } from "vitest";
import { type AuthPolicy, start } from "../../src/app.js";

type AuthClient = Client<MethodsOf<typeof AuthService>>;

const KEY = "tg_dev_data_loss_key_0123456789abcdef";
const OTHER_KEY = "tg_dev_data_loss_other_0123456789abcd";
const pricing = { inputPerMillion: 1, outputPerMillion: 1 };
const GATEWAY: GatewayConfig = parseGatewayConfig({
  upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:1/v1" }],
  models: [{ id: "mini", upstream: "u", upstreamModel: "a", runtime: "vllm", pricing }],
  accounts: [
    {
      id: "demo",
      connections: [
        {
          id: "default",
          models: ["mini"],
          defaultModel: "mini",
          budget: { amount: "1000000", period: "month" },
          keys: [
            { id: "dev", secret: KEY },
            { id: "other", secret: OTHER_KEY },
          ],
        },
      ],
    },
  ],
});

const chat = (key: string) => ({ key, route: Route.CHAT_COMPLETIONS, model: "", maxOutputTokens: 16 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Fixture {
  redis: RedisFixture;
  app: AuthPolicy;
  client: AuthClient;
  logs: LogCapture;
}
let current: Fixture | undefined;

/** auth-policy on its own private redis-server (never the shared one: the tests restart it). */
async function startOnPrivateRedis(): Promise<Fixture> {
  const redis = await privateRedis();
  const logs = captureLogs();
  const log = createLogger({ service: "auth-policy", level: "info", destination: logs.stream });
  const app = await start(
    { grpcHost: "127.0.0.1", grpcPort: 0, gateway: GATEWAY, redisUrl: redis.url, redisPrefix: "loss:" },
    log,
  );
  const client = createClient(AuthService, `127.0.0.1:${app.port}`);
  await client.$ready(5_000);
  current = { redis, app, client, logs };
  return current;
}

afterEach(async () => {
  const f = current;
  current = undefined;
  if (!f) return;
  f.client.$close();
  await f.app.stop();
  await f.redis.stop();
});

/** Polls until `check` resolves, up to `ms`; returns how long it took. */
async function within(ms: number, check: () => Promise<unknown>): Promise<number> {
  const t0 = Date.now();
  for (;;) {
    try {
      await check();
      return Date.now() - t0;
    } catch (err) {
      if (Date.now() - t0 > ms) throw err;
      await sleep(50);
    }
  }
}

const messages = (logs: LogCapture, level: string) =>
  logs
    .records()
    .filter((r) => r["level"] === level)
    .map((r) => r["msg"]);

describe("auth-policy and a Redis that lost its data", () => {
  it("re-seeds the configuration when Redis comes back empty, without a restart", async () => {
    const { redis, client, logs } = await startOnPrivateRedis();
    expect((await client.authorize(chat(KEY))).principal?.keyId).toBe("dev");

    await redis.restart();
    // OTHER_KEY was never used, so no cache in front of the store (1 s) can answer for it.
    const tookMs = await within(10_000, async () =>
      expect((await client.authorize(chat(OTHER_KEY))).principal?.keyId).toBe("other"),
    );
    expect(tookMs).toBeLessThan(5_000);
    await sleep(1_100);
    expect((await client.authorize(chat(KEY))).principal?.keyId).toBe("dev");

    expect(messages(logs, "error")).toContainEqual(expect.stringContaining("store lost its data"));
    const reseeded = logs.records().find((r) => r["msg"] === "store lost its data; configuration re-seeded");
    expect(reseeded).toMatchObject({ level: "warn", accounts: 1, connections: 1, keys: 2 });
    expect(logs.text()).not.toContain(KEY.slice(8));
    expect(logs.text()).not.toContain(OTHER_KEY.slice(8));
  });

  it("never refuses a configured key as invalid while Redis is emptied and re-seeded", async () => {
    const { redis, client, logs } = await startOnPrivateRedis();
    const statusOf = (key: string) =>
      client.authorize(chat(key)).then(
        () => "ok",
        (e: unknown) => (e instanceof RemoteError ? GrpcStatus[e.status] : String(e)),
      );
    expect(await statusOf(KEY)).toBe("ok");

    // Emptied under a live connection (no reconnect, so no "ready" to re-seed on): the first
    // lookup of a key finds the marker gone, answers UNAVAILABLE (a retryable 503) and re-seeds.
    const admin = connectRedis(redis.url);
    try {
      await admin.flushall();
    } finally {
      await quitRedis(admin);
    }
    expect(await statusOf(OTHER_KEY)).toBe("UNAVAILABLE");
    await within(5_000, async () => expect(await statusOf(OTHER_KEY)).toBe("ok"));

    // Restarted empty: every answer until the re-seed is done is UNAVAILABLE, none UNAUTHENTICATED.
    await sleep(1_100); // past the key cache, so that only the store answers for either key
    await redis.restart();
    const seen = new Map<string, number>();
    const t0 = Date.now();
    for (let i = 0; Date.now() - t0 < 10_000; i++) {
      const status = await statusOf(i % 2 === 0 ? OTHER_KEY : KEY);
      seen.set(status, (seen.get(status) ?? 0) + 1);
      if (status === "ok" && Date.now() - t0 > 1_500) break;
    }
    expect(seen.get("UNAUTHENTICATED")).toBeUndefined();
    expect(seen.get("ok")).toBeGreaterThan(0);
    expect(messages(logs, "warn")).toContainEqual("store lost its data; configuration re-seeded");
  });

  it("keeps a revoked configured key revoked and an admin budget change across a reconnect to a Redis that kept its data", async () => {
    const { redis, client, logs } = await startOnPrivateRedis();
    await client.revokeKey({ keyId: "other" });
    await client.updateConnection({
      accountId: "demo",
      connectionId: "default",
      budget: { amount: "777", period: BudgetPeriod.MONTH, periodDays: 0 },
    });
    const refused = await client.authorize(chat(OTHER_KEY)).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(RemoteError);
    expect(refused).toMatchObject({ status: GrpcStatus.UNAUTHENTICATED });

    // Every normal connection but the killer's is dropped: auth-policy reconnects to the same data.
    const admin = connectRedis(redis.url);
    try {
      expect(Number(await admin.call("CLIENT", "KILL", "TYPE", "normal"))).toBeGreaterThan(0);
    } finally {
      await quitRedis(admin);
    }
    await within(10_000, async () =>
      expect(messages(logs, "info")).toContainEqual(
        expect.stringContaining("its data (the seed marker) is intact"),
      ),
    );

    const again = await client.authorize(chat(OTHER_KEY)).catch((e: unknown) => e);
    expect(again).toMatchObject({ status: GrpcStatus.UNAUTHENTICATED });
    expect((await client.authorize(chat(KEY))).principal?.keyId).toBe("dev");
    const { connection } = await client.getConnection({ accountId: "demo", connectionId: "default" });
    expect(connection?.budget).toMatchObject({ amount: "777", period: BudgetPeriod.MONTH });
    expect(messages(logs, "error")).not.toContainEqual(expect.stringContaining("store lost its data"));
  });
});
