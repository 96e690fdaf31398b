import { request } from "node:http";
import { createClient } from "@tollgate/kit/grpc";
import { MeteringService } from "@tollgate/proto/metering";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack, waitForReady } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * Process crashes (SIGKILL: an OOM kill, a lost node) on the multi-process stack, as opposed to
 * the graceful stops of shutdown.e2e.test.ts. The fake upstream takes 2 s before each answer, so
 * a buffered request is still running when its api-edge dies.
 */
const LATENCY_MS = 2_000;
const MODEL = "tollgate-mini";

describe("process crashes (multi-process stack)", () => {
  const namespace = uniqueNamespace("crash");
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 1,
      upstreamEnv: { FAKE_LATENCY_MS: String(LATENCY_MS) },
    });
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  // By default far below the 5 minutes a duplicate may wait for a request that is really running.
  const post = (body: string, key: string, signal = AbortSignal.timeout(25_000)) =>
    fetch(`${stack.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        authorization: `Bearer ${stack.demoKey}`,
        "content-type": "application/json",
        "idempotency-key": key,
      },
      body,
      signal,
    });

  it("a retry of an Idempotency-Key request whose api-edge was killed runs within seconds, once, billed as told", async () => {
    const metering = createClient(
      MeteringService,
      `127.0.0.1:${stack.processes.find((p) => p.name === "metering")!.port}`,
      stack.internalAuth("api-edge"),
    );
    const before = (await metering.getUsage({ accountId: "demo" })).totals;
    const body = JSON.stringify({
      model: MODEL,
      max_tokens: 8,
      messages: [{ role: "user", content: "crash and retry" }],
    });
    const key = `crash-${namespace}`;
    // The first attempt: its api-edge is killed while the upstream works on it.
    const first = new Promise<string>((resolve) => {
      const req = request(
        `${stack.url}/v1/chat/completions`,
        {
          method: "POST",
          headers: {
            authorization: `Bearer ${stack.demoKey}`,
            "content-type": "application/json",
            "idempotency-key": key,
          },
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(`answered ${res.statusCode}`));
          res.on("error", (e) => resolve(e.message));
        },
      );
      req.on("error", (e) => resolve(e.message));
      req.end(body);
    });
    await new Promise((r) => setTimeout(r, LATENCY_MS / 3));
    await stack.stopProcess("api-edge", "SIGKILL");
    expect(await first).not.toMatch(/^answered/);
    await stack.startProcess("api-edge");
    await waitForReady(stack.url);

    // The caller retries, as an Idempotency-Key is for: it is answered, not held up for the
    // minutes a running request may take nor refused 409 idempotency_in_progress.
    const started = Date.now();
    const retry = await post(body, key);
    expect(retry.status, await retry.clone().text()).toBe(200);
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(retry.headers.get("idempotent-replayed")).toBeNull();
    const cost = BigInt(retry.headers.get("x-tollgate-cost") ?? "-1");
    expect(cost).toBeGreaterThan(0n);
    // A second retry replays the stored answer without running the model again.
    const replay = await post(body, key);
    expect(replay.status).toBe(200);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.headers.get("x-tollgate-cost")).toBe(String(cost));

    // Metering recorded exactly what the caller was told: the killed attempt (its router call
    // cancelled with the connection) charged nothing.
    const deadline = Date.now() + 15_000;
    let spent = -1n;
    while (Date.now() < deadline) {
      const totals = (await metering.getUsage({ accountId: "demo" })).totals;
      spent = BigInt(totals?.cost ?? "0") - BigInt(before?.cost ?? "0");
      if (spent >= cost) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    // Let a late event of the killed attempt land, if any, before the last read.
    await new Promise((r) => setTimeout(r, 1_000));
    spent =
      BigInt((await metering.getUsage({ accountId: "demo" })).totals?.cost ?? "0") -
      BigInt(before?.cost ?? "0");
    expect(spent).toBe(cost);
    metering.$close();
  }, 90_000);

  it("a duplicate whose caller leaves while it waits for a dead api-edge's claim never runs the model", async () => {
    const metering = createClient(
      MeteringService,
      `127.0.0.1:${stack.processes.find((p) => p.name === "metering")!.port}`,
      stack.internalAuth("api-edge"),
    );
    const totals = async () => BigInt((await metering.getUsage({ accountId: "demo" })).totals?.cost ?? "0");
    const body = JSON.stringify({
      model: MODEL,
      max_tokens: 8,
      messages: [{ role: "user", content: "crash, wait and leave" }],
    });
    const key = `crash-leave-${namespace}`;
    const attempt = (signal?: AbortSignal) => post(body, key, signal).catch((e: Error) => e);
    // The first attempt's api-edge dies while the upstream works on it: its claim is left behind.
    const first = attempt();
    await new Promise((r) => setTimeout(r, LATENCY_MS / 3));
    await stack.stopProcess("api-edge", "SIGKILL");
    expect(await first).toBeInstanceOf(Error);
    await stack.startProcess("api-edge");
    await waitForReady(stack.url);
    await new Promise((r) => setTimeout(r, 2_000));
    const before = await totals();
    // A duplicate waits for that claim, and its caller gives up after a second.
    expect(await attempt(AbortSignal.timeout(1_000))).toBeInstanceOf(Error);
    // Past the claim's lapse and the upstream's latency: had the duplicate run, it would be billed.
    await new Promise((r) => setTimeout(r, 10_000 + LATENCY_MS + 2_000));
    expect(await totals()).toBe(before);
    // The caller's next retry runs the model itself (no stored answer of a run nobody read).
    const retry = await attempt(AbortSignal.timeout(25_000));
    expect(retry).not.toBeInstanceOf(Error);
    const res = retry as Response;
    expect(res.status).toBe(200);
    expect(res.headers.get("idempotent-replayed")).toBeNull();
    const cost = BigInt(res.headers.get("x-tollgate-cost") ?? "-1");
    const deadline = Date.now() + 15_000;
    while ((await totals()) - before < cost && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 200));
    await new Promise((r) => setTimeout(r, 1_000));
    expect((await totals()) - before).toBe(cost);
    metering.$close();
  }, 120_000);
});
