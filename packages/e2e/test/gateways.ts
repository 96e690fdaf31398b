import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type AllInOne, startAllInOne } from "@tollgate/all-in-one";
import { DEFAULT_SHUTDOWN_TIMEOUT_MS } from "@tollgate/kit/config";
import {
  type FakeUpstream,
  type FakeUpstreamOptions,
  startFakeUpstream,
} from "@tollgate/testkit/fake-upstream";
import { freePort } from "@tollgate/testkit/fixtures";
import { captureLogs, type LogCapture } from "@tollgate/testkit/logs";
import { REPO_ROOT, type Stack } from "@tollgate/testkit/stack";

/** The all-in-one process, spawned exactly as `npm start` runs it. */
export interface SpawnedGateway {
  port: number;
  pid: number;
  /** Whether the process is still running. */
  alive(): boolean;
  /** Log lines (stdout). */
  stdout(): string;
  /** The banner (stderr): the demo key is printed there on purpose. */
  stderr(): string;
  stop(): Promise<void>;
}

/**
 * Spawns `packages/all-in-one/src/main.ts` with only PATH, HOME, a free PORT, a free metrics
 * port and `env`, and waits for its banner.
 */
export async function spawnAllInOne(env: Record<string, string> = {}): Promise<SpawnedGateway> {
  const port = await freePort();
  const child = spawn(
    process.execPath,
    ["--import", "tsx", join(REPO_ROOT, "packages/all-in-one/src/main.ts")],
    {
      cwd: REPO_ROOT,
      // A free metrics port too, so parallel runs never meet on the default 9090.
      env: { PATH: process.env.PATH, HOME: process.env.HOME, PORT: String(port), METRICS_PORT: "0", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c: Buffer) => {
    stdout += c.toString("utf8");
  });
  child.stderr.on("data", (c: Buffer) => {
    stderr += c.toString("utf8");
  });
  const stop = () =>
    new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      child.once("exit", () => {
        clearTimeout(timer);
        resolve();
      });
      child.kill("SIGTERM");
    });
  const deadline = Date.now() + 30_000;
  while (!stderr.includes("Tollgate is running on")) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`all-in-one did not start:\n${stderr}\n${stdout}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    port,
    pid: child.pid!,
    alive: () => child.exitCode === null && child.signalCode === null,
    stdout: () => stdout,
    stderr: () => stderr,
    stop,
  };
}

/** An in-process all-in-one gateway on a configuration written for the test. */
export interface ConfiguredGateway {
  gateway: AllInOne;
  upstream: FakeUpstream;
  logs: LogCapture;
  stop(): Promise<void>;
}

/**
 * Starts a fake upstream, writes the configuration `yaml(upstreamUrl)` to a temporary file and
 * runs the all-in-one gateway on it in this process, its logs captured.
 */
export async function startConfiguredGateway(
  yaml: (upstreamUrl: string) => string,
  opts: {
    upstream?: FakeUpstreamOptions;
    metricsPort?: number;
    /** The gateway's environment (e.g. the variables upstreams' apiKeyEnv name). */
    env?: Record<string, string>;
  } = {},
): Promise<ConfiguredGateway> {
  const upstream = await startFakeUpstream(opts.upstream);
  const dir = mkdtempSync(join(tmpdir(), "tollgate-e2e-"));
  writeFileSync(join(dir, "tollgate.yaml"), yaml(upstream.url));
  const logs = captureLogs();
  const gateway = await startAllInOne(
    {
      host: "127.0.0.1",
      port: 0,
      configPath: join(dir, "tollgate.yaml"),
      natsNamespace: "",
      redisPrefix: "tollgate:",
      logLevel: "info",
      shutdownTimeoutMs: DEFAULT_SHUTDOWN_TIMEOUT_MS,
      tempoDevnetPort: 0,
      ...(opts.metricsPort !== undefined ? { metricsHost: "127.0.0.1", metricsPort: opts.metricsPort } : {}),
      env: opts.env ?? {},
    },
    logs.stream,
  );
  return {
    gateway,
    upstream,
    logs,
    stop: async () => {
      await gateway.stop();
      await upstream.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Creates something through a stack's admin API (its first api-edge): POST, expects 201, returns the JSON. */
export async function adminCreate(
  stack: Pick<Stack, "adminUrls" | "adminToken">,
  path: string,
  body: unknown,
): Promise<Record<string, unknown>> {
  const res = await fetch(`${stack.adminUrls[0]}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.adminToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (res.status !== 201) throw new Error(`admin POST ${path}: ${res.status} ${await res.text()}`);
  return (await res.json()) as Record<string, unknown>;
}
