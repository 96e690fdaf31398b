import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, uniqueNamespace, useNats, useRedis } from "@tollgate/testkit/fixtures";
import {
  DEMO_CONFIG,
  REPO_ROOT,
  type Stack,
  startStack,
  waitForPort,
  waitForReady,
} from "@tollgate/testkit/stack";
import { findPid, memoryOf, type Role, type Runtime, spawnScript, stopChild, track } from "./procs.js";
import type { Target } from "./scenarios.js";
import { sleep } from "./stats.js";

/**
 * The fake upstream: buffered answers at once (no latency); streams are paced like a model,
 * a few ms to the first token then a steady token rate, so chunk gaps can be compared.
 */
export const UPSTREAM_ENV = { FAKE_TTFT_MS: "5", FAKE_TOKENS_PER_SECOND: "200" };
/** Generous limits and budget: every check runs, none refuses. */
const LIMIT = 1_000_000_000;
const TOKEN_LIMIT = 4_000_000_000;
const BUDGET = "1000000000000000";

/** A gateway started for the benchmark, with the processes whose memory is reported. */
export interface Running {
  target: Target;
  /** idleMb: VmRSS one second after the process was ready, before any request. */
  processes: Array<{ name: string; pid: number | undefined; role: Role; idleMb?: number }>;
  stop(): Promise<void>;
}

/** Lets the processes settle for a second after start, then records their idle RSS. */
async function sampleIdle(processes: Running["processes"]): Promise<void> {
  await sleep(1000);
  for (const p of processes) if (p.pid !== undefined) p.idleMb = memoryOf(p.pid)?.rss;
}

/** Runs `steps` in reverse order, ignoring failures (so one stuck step never leaves the rest running). */
async function unwind(steps: Array<() => Promise<void>>): Promise<void> {
  for (const step of steps.reverse()) await step().catch(() => {});
}

/**
 * The all-in-one process as `npm start` runs it (in-memory store and bus, bundled devnet), with
 * TOLLGATE_CONFIG = the demo configuration pointed at a fake upstream process, plus a bench
 * account whose connection has rate limits (account, connection, key) and a budget.
 */
export async function startAllInOne(
  logsDir: string,
  nodeArgs: string[] = [],
  runtime: Runtime = "tsx",
  env: NodeJS.ProcessEnv = {},
): Promise<Running> {
  const steps: Array<() => Promise<void>> = [];
  try {
    const upstreamPort = await freePort();
    const upstream = spawnScript(
      "packages/testkit/src/bin/fake-upstream.ts",
      { ...UPSTREAM_ENV, PORT: String(upstreamPort), HOST: "127.0.0.1" },
      join(logsDir, "all-in-one-fake-upstream.log"),
    );
    steps.push(() => stopChild(upstream));
    await waitForPort(upstreamPort);

    const key = `tg_bench_${randomBytes(16).toString("hex")}`;
    const config = `${readFileSync(DEMO_CONFIG, "utf8")
      .replace("http://127.0.0.1:18000/v1", `http://127.0.0.1:${upstreamPort}/v1`)
      .trimEnd()}
  - id: bench
    limits: { requestsPerMinute: ${LIMIT}, tokensPerMinute: ${TOKEN_LIMIT} }
    connections:
      - id: bench-conn
        models: [tollgate-mini]
        defaultModel: tollgate-mini
        limits:
          requestsPerMinute: ${LIMIT}
          tokensPerMinute: ${TOKEN_LIMIT}
          keyRequestsPerMinute: ${LIMIT}
          keyTokensPerMinute: ${TOKEN_LIMIT}
        budget: { amount: ${BUDGET}, period: month }
        keys:
          - id: bench-key
            secret: ${key}
`;
    const configPath = join(logsDir, "all-in-one.yaml");
    writeFileSync(configPath, config);
    const port = await freePort();
    const devnetPort = await freePort();
    const metricsPort = await freePort();
    const gateway = spawnScript(
      "packages/all-in-one/src/main.ts",
      {
        HOST: "127.0.0.1",
        PORT: String(port),
        TEMPO_DEVNET_PORT: String(devnetPort),
        METRICS_PORT: String(metricsPort),
        TOLLGATE_CONFIG: configPath,
        ...env,
      },
      join(logsDir, "all-in-one.log"),
      nodeArgs,
      runtime,
    );
    steps.push(() => stopChild(gateway, 20_000));
    const url = `http://127.0.0.1:${port}`;
    await waitForReady(url, 60_000);
    const processes: Running["processes"] = [
      { name: "all-in-one", pid: gateway.pid, role: "all-in-one" },
      { name: "fake-upstream", pid: upstream.pid, role: "harness" },
    ];
    await sampleIdle(processes);
    return {
      target: {
        mode: "all-in-one",
        gatewayUrl: url,
        upstreamUrl: `http://127.0.0.1:${upstreamPort}/v1`,
        key,
        rpcUrl: `http://127.0.0.1:${devnetPort}`,
        metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`,
      },
      processes,
      stop: () => unwind(steps),
    };
  } catch (err) {
    await unwind(steps);
    throw err;
  }
}

/** The multi-process stack on private NATS and Redis: 2 inference-routers, 1 api-edge. */
export interface RunningStack extends Running {
  stack: Stack;
  natsUrl: string;
  redisUrl: string;
  namespace: string;
  configPath: string;
}

/**
 * The multi-process stack (real NATS JetStream and Redis, two inference-routers, one api-edge)
 * and a bench key made through the admin API: account and connection rate limits, a per-key
 * limit and a connection budget, all far above what the run sends.
 */
export async function startBenchStack(logsDir: string, runtime: Runtime = "tsx"): Promise<RunningStack> {
  const steps: Array<() => Promise<void>> = [];
  try {
    const nats = await useNats();
    steps.push(() => nats.stop());
    const redis = await useRedis();
    steps.push(() => redis.stop());
    const namespace = uniqueNamespace("bench");
    const stackDir = join(logsDir, "stack");
    const stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 2,
      edges: 1,
      upstreamEnv: UPSTREAM_ENV,
      // Logs go to files: piping every request's log line into the load generator would load it.
      logDir: stackDir,
      runtime,
    });
    steps.push(() => stack.stop());

    const processes: Running["processes"] = stack.processes.map((p) => ({
      name: p.name,
      pid: p.child.pid,
      role: p.name === "fake-upstream" || p.name === "tempo-devnet" ? "harness" : "service",
    }));
    const portOf = (url: string) => new URL(url).port;
    if (!nats.shared)
      processes.push({
        name: "nats-server",
        pid: findPid((argv) => /nats-server$/.test(argv[0] ?? "") && argv.includes(portOf(nats.url))),
        role: "infra",
      });
    if (!redis.shared)
      processes.push({
        name: "redis-server",
        pid: findPid(
          (argv) => /redis-server/.test(argv[0] ?? "") && argv.join(" ").includes(`:${portOf(redis.url)}`),
        ),
        role: "infra",
      });
    await sampleIdle(processes);

    const admin = async (path: string, body: unknown) => {
      const res = await fetch(`${stack.adminUrls[0]}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${stack.adminToken}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      if (res.status !== 201) throw new Error(`admin ${path} answered ${res.status}: ${await res.text()}`);
      return (await res.json()) as Record<string, unknown>;
    };
    await admin("/admin/v1/accounts", {
      id: "bench",
      limits: { requests_per_minute: LIMIT, tokens_per_minute: TOKEN_LIMIT },
    });
    await admin("/admin/v1/accounts/bench/connections", {
      id: "bench-conn",
      models: ["tollgate-mini"],
      default_model: "tollgate-mini",
      limits: {
        requests_per_minute: LIMIT,
        tokens_per_minute: TOKEN_LIMIT,
        key_requests_per_minute: LIMIT,
        key_tokens_per_minute: TOKEN_LIMIT,
      },
      budget: { amount: BUDGET, period: "month" },
    });
    const { secret } = (await admin("/admin/v1/accounts/bench/connections/bench-conn/keys", {
      name: "bench",
    })) as { secret: string };
    const upstream = stack.processes.find((p) => p.name === "fake-upstream")!;
    return {
      target: {
        mode: "stack",
        gatewayUrl: stack.url,
        upstreamUrl: `http://127.0.0.1:${upstream.port}/v1`,
        key: secret,
        rpcUrl: stack.tempoRpcUrl,
      },
      processes,
      stop: () => unwind(steps),
      stack,
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      configPath: join(stackDir, "tollgate.yaml"),
    };
  } catch (err) {
    await unwind(steps);
    throw err;
  }
}

/** The peer gateway's entry point, as its package runs it (`npx @portkey-ai/gateway`). */
export const PORTKEY_ENTRY = "node_modules/@portkey-ai/gateway/build/start-server.js";

/**
 * The peer: Portkey's open-source gateway (the version pinned in package.json) on its own fake
 * upstream, started as its package starts it (`--headless`, no UI) under the same node as
 * Tollgate's processes. Two preloads: one binds it to 127.0.0.1 (it listens on every interface),
 * one lets its streamed responses carry its headers (see bench/lib/portkey-stream-headers.mjs).
 * Requests reach the fake upstream through `x-portkey-provider: openai` and
 * `x-portkey-custom-host`.
 */
export async function startPortkey(logsDir: string): Promise<Running> {
  const steps: Array<() => Promise<void>> = [];
  try {
    const upstreamPort = await freePort();
    const upstream = spawnScript(
      "packages/testkit/src/bin/fake-upstream.ts",
      { ...UPSTREAM_ENV, PORT: String(upstreamPort), HOST: "127.0.0.1" },
      join(logsDir, "portkey-fake-upstream.log"),
    );
    steps.push(() => stopChild(upstream));
    await waitForPort(upstreamPort);

    const port = await freePort();
    const fd = openSync(join(logsDir, "portkey.log"), "a");
    const gateway = spawn(
      process.execPath,
      [
        "--import",
        "./bench/lib/listen-loopback.mjs",
        "--import",
        "./bench/lib/portkey-stream-headers.mjs",
        PORTKEY_ENTRY,
        `--port=${port}`,
        "--headless",
      ],
      {
        cwd: REPO_ROOT,
        env: { PATH: process.env["PATH"], HOME: process.env["HOME"] },
        stdio: ["ignore", fd, fd],
      },
    );
    track(gateway);
    steps.push(() => stopChild(gateway));
    await waitForPort(port);
    const processes: Running["processes"] = [
      { name: "portkey", pid: gateway.pid, role: "peer" },
      { name: "fake-upstream", pid: upstream.pid, role: "harness" },
    ];
    await sampleIdle(processes);
    const upstreamUrl = `http://127.0.0.1:${upstreamPort}/v1`;
    return {
      target: {
        mode: "portkey",
        gatewayUrl: `http://127.0.0.1:${port}`,
        upstreamUrl,
        key: "",
        rpcUrl: "",
        peerHeaders: {
          authorization: "Bearer bench",
          "x-portkey-provider": "openai",
          "x-portkey-custom-host": upstreamUrl,
        },
      },
      processes,
      stop: () => unwind(steps),
    };
  } catch (err) {
    await unwind(steps);
    throw err;
  }
}
