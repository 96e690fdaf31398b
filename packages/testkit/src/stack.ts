import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { dialEnv, portOf, SERVICE_NAMES, type ServiceName, TOPOLOGY } from "@tollgate/config/topology";
import { DEMO_PAYEE_PRIVATE_KEY } from "@tollgate/demo/tempo-devnet";
import { type InternalAuth, isServiceIdentity, type ServiceIdentity } from "@tollgate/kit/credentials";
import { freePort } from "./fixtures.js";
import { writeStackTokens } from "./internal-auth.js";

/** The repository root (this file is packages/testkit/src/stack.ts). */
export const REPO_ROOT = fileURLToPath(new URL("../../../", import.meta.url));
/** The demo configuration shipped in the repository. */
export const DEMO_CONFIG = join(REPO_ROOT, "deploy/config/tollgate.yaml");
const DEMO_UPSTREAM_URL = "http://127.0.0.1:18000/v1";

/** How to run the multi-process stack. */
export interface StackOptions {
  natsUrl: string;
  redisUrl: string;
  /** NATS namespace and Redis prefix suffix, so runs sharing servers never meet. */
  namespace?: string;
  /** Number of inference-router replicas (default 2). */
  routers?: number;
  /** Number of api-edge replicas (default 1), each with its own public and admin port. */
  edges?: number;
  /**
   * Number of mpp-payment replicas (default 1) on the one Redis; api-edge spreads its calls over
   * them (packages/kit/src/least-request.ts). One replica is named "mpp-payment", several
   * "mpp-payment-1", "mpp-payment-2", ...
   */
  payments?: number;
  /**
   * Extra environment of every mpp-payment replica (MPP_RESERVATION_TTL_SECONDS,
   * TEMPO_RPC_TIMEOUT_MS, or TEMPO_RPC_URL to put a fault-injecting proxy before the devnet).
   */
  paymentEnv?: Record<string, string>;
  /** Public port of the first api-edge (default: a free one). */
  port?: number;
  /** Admin port of the first api-edge (default: a free one). */
  adminPort?: number;
  /** Port of the fake upstream (default: a free one); the demo config is rewritten to it. */
  upstreamPort?: number;
  /**
   * An upstream already listens on `upstreamPort` (e.g. an in-process fake whose recorded
   * requests the test reads): none is launched.
   */
  externalUpstream?: boolean;
  /** Port of the Tempo devnet (default: a free one). */
  devnetPort?: number;
  /**
   * Extra environment of the fake upstream (FAKE_TTFT_MS, FAKE_TOKENS_PER_SECOND,
   * FAKE_OUTPUT_TOKENS, ...; see src/bin/fake-upstream.ts), e.g. to make streams slow.
   */
  upstreamEnv?: Record<string, string>;
  /**
   * Rewrites the configuration file every service reads (the demo configuration, already
   * pointed at the stack's fake upstream), e.g. to add upstreams the test runs itself.
   */
  transformConfig?: (yaml: string) => string;
  /**
   * Metrics ports: consecutive ones from this, one per service process in start order (default:
   * free ones).
   */
  metricsPortBase?: number;
  /** Fixed gRPC ports (default: free ones). */
  grpcPorts?: { auth: number; metering: number; payment: number; routers: number[] };
  /**
   * Run detached, each process logging to <logDir>/<name>.log, so the stack outlives the
   * launcher (`make up`). Without it the processes are children of this one.
   */
  logDir?: string;
  logLevel?: string;
  /**
   * How services run: "tsx" (default) runs their TypeScript sources; "bundle" runs the esbuild
   * bundles the images ship (services/<name>/dist/main.mjs, see buildBundles) under plain node.
   * The fake upstream and the devnet always run from source.
   */
  runtime?: "tsx" | "bundle";
  /**
   * Extra environment of every Tollgate service process (not the fake upstream or the devnet),
   * e.g. OTEL_EXPORTER_OTLP_ENDPOINT to export their traces.
   */
  serviceEnv?: Record<string, string>;
  /** Called with every line any process prints. */
  onLine?: (service: string, line: string) => void;
}

/** The service identity of a service's main script (services/<name>/src/main.ts). */
const SERVICE_MAIN = /^services\/([^/]+)\/src\/main\.ts$/;

const MAIN = /^((?:services|packages)\/[^/]+)\/src\/main\.ts$/;

/**
 * Node's arguments for a script: with runtime "bundle" and a main, its bundle with the node
 * flags its image runs it with (packages/config/src/topology.ts); else tsx.
 */
export function commandOf(script: string, runtime: "tsx" | "bundle"): string[] {
  const dir = MAIN.exec(script)?.[1];
  if (runtime === "bundle" && dir) return [...imageNodeFlags(dir), join(REPO_ROOT, dir, "dist/main.mjs")];
  return ["--import", "tsx", join(REPO_ROOT, script)];
}

/** The flags between node and the bundle in a service's image (services/<name>); [] for others. */
export function imageNodeFlags(dir: string): string[] {
  const name = /^services\/([^/]+)$/.exec(dir)?.[1];
  return name !== undefined && name in TOPOLOGY ? [...TOPOLOGY[name as ServiceName].nodeFlags] : [];
}

/**
 * Builds the bundles the images run (deploy/build/bundle.mjs) for the given service or package
 * folders, e.g. "services/api-edge"; what `runtime: "bundle"` runs.
 */
export function buildBundles(dirs: readonly string[]): void {
  for (const dir of dirs) {
    execFileSync(process.execPath, [join(REPO_ROOT, "deploy/build/bundle.mjs"), join(REPO_ROOT, dir)], {
      cwd: REPO_ROOT,
      stdio: ["ignore", "ignore", "inherit"],
    });
  }
}

/** The five services, as buildBundles names them. */
export const SERVICE_DIRS: readonly string[] = SERVICE_NAMES.map((s) => `services/${s}`);

/** One running service process. */
export interface StackProcess {
  name: string;
  port: number;
  child: ChildProcess;
}

/** A running multi-process stack. */
export interface Stack {
  /** Public URL of the first api-edge. */
  url: string;
  /** Public URL of every api-edge replica, in start order. */
  urls: string[];
  /** Admin API URL of every api-edge replica, in the order of `urls`. */
  adminUrls: string[];
  /** The stack's admin token (random per stack); every replica accepts it. */
  adminToken: string;
  /** JSON-RPC URL of the stack's Tempo devnet. */
  tempoRpcUrl: string;
  demoKey: string;
  processes: StackProcess[];
  /** The Prometheus /metrics URL of every service process, by process name. */
  metricsUrls: Record<string, string>;
  /**
   * Credentials acting as one service (its own token), for a test that calls a service's gRPC
   * port directly; every process of the stack authenticates with per-service tokens.
   */
  internalAuth(name: ServiceIdentity): InternalAuth;
  /** The stack's directory: its configuration and the token files under internal-auth/. */
  dir: string;
  /** Everything every process printed so far. */
  output(): string;
  /**
   * Stops one process (SIGTERM, as Kubernetes would; SIGKILL for a crash); `start` brings it
   * back on its port.
   */
  stopProcess(name: string, signal?: "SIGTERM" | "SIGKILL"): Promise<void>;
  startProcess(name: string): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Resolves once something accepts on 127.0.0.1:port. With `child`, fails as soon as that process
 * exits instead of waiting out the timeout, naming how it ended (its output is in the stack's lines).
 */
export function waitForPort(
  port: number,
  timeoutMs = 30_000,
  child?: { name: string; process: ChildProcess },
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  return new Promise((resolve, reject) => {
    let exited: string | undefined;
    const onExit = (code: number | null, signal: NodeJS.Signals | null) => {
      exited = signal ?? `code ${code}`;
    };
    child?.process.once("exit", onExit);
    const finish = (err?: Error) => {
      child?.process.off("exit", onExit);
      if (err) reject(err);
      else resolve();
    };
    const attempt = () => {
      if (exited !== undefined)
        return finish(new Error(`${child?.name} exited (${exited}) before it listened on 127.0.0.1:${port}`));
      const socket = connect({ host: "127.0.0.1", port });
      socket.once("connect", () => {
        socket.destroy();
        finish();
      });
      socket.once("error", () => {
        socket.destroy();
        if (Date.now() > deadline)
          finish(new Error(`nothing listens on 127.0.0.1:${port} after ${timeoutMs} ms`));
        else setTimeout(attempt, 100);
      });
    };
    attempt();
  });
}

/** Resolves once `url`/readyz answers 2xx; fails after `timeoutMs`. */
export async function waitForReady(url: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await fetch(`${url}/readyz`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`${url}/readyz did not turn ready within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 150));
  }
}

function stopChild(
  child: ChildProcess,
  timeoutMs = 10_000,
  signal: "SIGTERM" | "SIGKILL" = "SIGTERM",
): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill(signal);
  });
}

/**
 * Starts every service as its own process (docs/architecture.md, "Three ways to run it"): the fake upstream,
 * metering, auth-policy, N inference-router replicas and api-edge, against real NATS and Redis.
 */
export async function startStack(opts: StackOptions): Promise<Stack> {
  const dir = opts.logDir ?? mkdtempSync(join(tmpdir(), "tollgate-stack-"));
  if (opts.logDir) mkdirSync(opts.logDir, { recursive: true });
  const upstreamPort = opts.upstreamPort ?? (await freePort());
  const configPath = join(dir, "tollgate.yaml");
  const demo = readFileSync(DEMO_CONFIG, "utf8");
  const config = demo.replace(DEMO_UPSTREAM_URL, `http://127.0.0.1:${upstreamPort}/v1`);
  writeFileSync(configPath, opts.transformConfig ? opts.transformConfig(config) : config);
  const demoKey = /secret:\s*(\S+)/.exec(demo)?.[1] ?? "";

  // Every api-edge replica of one stack shares the admin token; a new stack gets a new one.
  const adminToken = randomBytes(24).toString("base64url");
  // Every service authenticates its internal calls with its own random token (docs/kubernetes.md,
  // "Internal authentication"): files in the stack's directory, named by env.
  const tokens = writeStackTokens(dir);
  const lines: string[] = [];
  const processes: StackProcess[] = [];
  const metricsUrls: Record<string, string> = {};
  const common: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    TOLLGATE_CONFIG: configPath,
    NATS_URL: opts.natsUrl,
    REDIS_URL: opts.redisUrl,
    NATS_NAMESPACE: opts.namespace ?? "",
    REDIS_PREFIX: opts.namespace ? `tollgate:${opts.namespace}:` : "tollgate:",
    LOG_LEVEL: opts.logLevel ?? "info",
    GRPC_HOST: "127.0.0.1",
    INTERNAL_PEER_TOKENS_FILE: tokens.peersFile,
  };
  const launch = (
    name: string,
    script: string,
    port: number,
    env: NodeJS.ProcessEnv,
    metricsPort?: number,
  ) => {
    if (metricsPort !== undefined) metricsUrls[name] = `http://127.0.0.1:${metricsPort}/metrics`;
    const identity = SERVICE_MAIN.exec(script)?.[1];
    const logFile = opts.logDir ? openSync(join(opts.logDir, `${name}.log`), "a") : undefined;
    const child = spawn(process.execPath, commandOf(script, opts.runtime ?? "tsx"), {
      cwd: REPO_ROOT,
      env: {
        ...common,
        ...(identity && isServiceIdentity(identity)
          ? { INTERNAL_TOKEN_FILE: tokens.tokenFile(identity) }
          : {}),
        ...(script.startsWith("services/") ? opts.serviceEnv : {}),
        ...env,
        ...(metricsPort !== undefined
          ? { METRICS_HOST: "127.0.0.1", METRICS_PORT: String(metricsPort) }
          : {}),
      },
      stdio: logFile === undefined ? ["ignore", "pipe", "pipe"] : ["ignore", logFile, logFile],
      detached: logFile !== undefined,
    });
    if (logFile !== undefined) child.unref();
    const collect = (chunk: Buffer) => {
      for (const line of chunk.toString("utf8").split("\n")) {
        if (line === "") continue;
        lines.push(line);
        opts.onLine?.(name, line);
      }
    };
    child.stdout?.on("data", collect);
    child.stderr?.on("data", collect);
    const existing = processes.find((p) => p.name === name);
    if (existing) existing.child = child;
    else processes.push({ name, port, child });
    relaunch.set(name, () => launch(name, script, port, env, metricsPort));
    return waitForPort(port, 30_000, { name, process: child });
  };
  const relaunch = new Map<string, () => Promise<void>>();

  const stop = async () => {
    // Front to back, as a rolling shutdown would: edge, routers, then the rest.
    for (const p of [...processes].reverse()) await stopChild(p.child);
    if (!opts.logDir) rmSync(dir, { recursive: true, force: true });
  };

  try {
    const edgeCount = opts.edges ?? 1;
    if (!Number.isInteger(edgeCount) || edgeCount < 1)
      throw new Error("edges must be a whole number of at least 1");
    if (opts.externalUpstream && opts.upstreamPort === undefined)
      throw new Error("externalUpstream needs the upstreamPort it listens on");
    // Ports asked for in a row can repeat: every port of the stack is taken once.
    const given = {
      "auth-policy": opts.grpcPorts?.auth === undefined ? [] : [opts.grpcPorts.auth],
      metering: opts.grpcPorts?.metering === undefined ? [] : [opts.grpcPorts.metering],
      "mpp-payment": opts.grpcPorts?.payment === undefined ? [] : [opts.grpcPorts.payment],
      "inference-router": opts.grpcPorts?.routers ?? [],
      "api-edge": opts.port === undefined ? [] : [opts.port],
    } satisfies Record<ServiceName, number[]>;
    const taken = new Set<number>([
      upstreamPort,
      ...Object.values(given).flat(),
      ...(opts.devnetPort === undefined ? [] : [opts.devnetPort]),
      ...(opts.adminPort === undefined ? [] : [opts.adminPort]),
    ]);
    const anotherPort = async () => {
      for (;;) {
        const p = await freePort();
        if (!taken.has(p)) {
          taken.add(p);
          return p;
        }
      }
    };
    const devnetPort = opts.devnetPort ?? (await anotherPort());
    const replicas: Record<ServiceName, number> = {
      "api-edge": edgeCount,
      "auth-policy": 1,
      "inference-router": opts.routers ?? 2,
      metering: 1,
      "mpp-payment": opts.payments ?? 1,
    };
    // Each replica of each service of the topology: its name, main port and metrics port. One
    // replica keeps the service's name ("api-edge", logs/api-edge.log for `make up`), several
    // are numbered; routers are always numbered.
    const instances = {} as Record<ServiceName, { name: string; port: number; metricsPort: number }[]>;
    for (const service of SERVICE_NAMES) {
      const count = replicas[service];
      instances[service] = [];
      for (let i = 0; i < count; i++)
        instances[service].push({
          name: count === 1 && service !== "inference-router" ? service : `${service}-${i + 1}`,
          port: given[service][i] ?? (await anotherPort()),
          metricsPort: 0,
        });
    }
    const adminPorts: number[] = [];
    for (let i = 0; i < edgeCount; i++)
      adminPorts.push(i === 0 && opts.adminPort !== undefined ? opts.adminPort : await anotherPort());
    // Every service process gets its own free metrics port (replicas would clash on a default).
    let nextMetrics = opts.metricsPortBase;
    for (const service of SERVICE_NAMES)
      for (const instance of instances[service]) {
        if (nextMetrics === undefined) instance.metricsPort = await anotherPort();
        else {
          if (taken.has(nextMetrics))
            throw new Error(`metrics port ${nextMetrics} is another port of the stack`);
          taken.add(nextMetrics);
          instance.metricsPort = nextMetrics++;
        }
      }
    const mppSecret = randomBytes(32).toString("hex");
    // Every replica of a peer, in the variables the topology names (replicas comma-separated).
    const peers = (peer: ServiceName) => instances[peer].map((p) => `127.0.0.1:${p.port}`);
    // What a service needs besides its port and its peers.
    const own: Partial<Record<ServiceName, (i: number) => NodeJS.ProcessEnv>> = {
      "mpp-payment": () => ({
        TEMPO_RPC_URL: `http://127.0.0.1:${devnetPort}`,
        // Every replica of one stack shares the secret; a new stack gets a new one.
        MPP_SECRET: mppSecret,
        MPP_PAYEE_KEY: DEMO_PAYEE_PRIVATE_KEY,
        ...opts.paymentEnv,
      }),
      "api-edge": (i) => ({
        HOST: "127.0.0.1",
        ADMIN_HOST: "127.0.0.1",
        ADMIN_PORT: String(adminPorts[i]),
        ADMIN_TOKEN: adminToken,
      }),
    };
    const launchService = (service: ServiceName) =>
      instances[service].map(({ name, port, metricsPort }, i) =>
        launch(
          name,
          `services/${service}/src/main.ts`,
          port,
          {
            [portOf(service, "grpc") !== undefined ? "GRPC_PORT" : "PORT"]: String(port),
            ...dialEnv(service, peers),
            ...own[service]?.(i),
          },
          metricsPort,
        ),
      );
    // The gRPC services start together (each dials its peers on first use), peers before those
    // that dial them so that stopping in reverse stops callers first; the door, which needs
    // them to turn ready, after.
    const order: ServiceName[] = [];
    const visit = (s: ServiceName) => {
      if (order.includes(s)) return;
      for (const d of TOPOLOGY[s].dials) visit(d.service);
      order.push(s);
    };
    for (const s of SERVICE_NAMES) visit(s);
    const grpcServices = order.filter((s) => portOf(s, "grpc") !== undefined);
    await Promise.all([
      opts.externalUpstream
        ? waitForPort(upstreamPort, 30_000)
        : launch("fake-upstream", "packages/demo/src/bin/fake-upstream.ts", upstreamPort, {
            ...opts.upstreamEnv,
            PORT: String(upstreamPort),
            HOST: "127.0.0.1",
          }),
      launch("tempo-devnet", "packages/demo/src/bin/tempo-devnet.ts", devnetPort, {
        PORT: String(devnetPort),
        HOST: "127.0.0.1",
      }),
      ...grpcServices.flatMap(launchService),
    ]);
    await Promise.all(order.filter((s) => !grpcServices.includes(s)).flatMap(launchService));
    const edgePorts = instances["api-edge"].map((e) => e.port);
    const urls = edgePorts.map((p) => `http://127.0.0.1:${p}`);
    const adminUrls = adminPorts.map((p) => `http://127.0.0.1:${p}`);
    await Promise.all([
      ...urls.map((u) => waitForReady(u, 30_000)),
      ...adminPorts.map((p) => waitForPort(p, 30_000)),
      ...Object.values(metricsUrls).map((u) => waitForPort(Number(new URL(u).port), 30_000)),
    ]);
    return {
      url: urls[0]!,
      urls,
      adminUrls,
      adminToken,
      tempoRpcUrl: `http://127.0.0.1:${devnetPort}`,
      demoKey,
      processes,
      metricsUrls,
      internalAuth: (name) => tokens.as(name),
      dir,
      output: () => lines.join("\n"),
      stopProcess: async (name, signal = "SIGTERM") => {
        const p = processes.find((q) => q.name === name);
        if (!p) throw new Error(`no process named ${name}`);
        await stopChild(p.child, 10_000, signal);
      },
      startProcess: async (name) => {
        const again = relaunch.get(name);
        if (!again) throw new Error(`no process named ${name}`);
        await again();
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw new Error(`the stack did not start: ${(err as Error).message}\n${lines.slice(-40).join("\n")}`);
  }
}
