import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";

/** A NATS or Redis server a test may use; private instances can be stopped and restarted. */
export interface ServerFixture {
  url: string;
  /** True when the URL came from the environment: the server is shared, keys must be namespaced. */
  shared: boolean;
  /** Kills a private server and removes its data directory; a no-op for a shared server. */
  stop(): Promise<void>;
  /**
   * Restarts a private server on the same port with the same data directory, after it stayed
   * down for `downMs` (default 0) and until `until` resolved (if given); throws for a shared one.
   */
  restart(opts?: { downMs?: number; until?: Promise<unknown> }): Promise<void>;
}

/** A NATS server with JetStream enabled. */
export type NatsFixture = ServerFixture;
/** A Redis server. */
export type RedisFixture = ServerFixture;

/** Options of a Redis fixture; ignored when REDIS_URL points at a shared server. */
export interface RedisOptions {
  /** Turns on the append-only file so data survives restart(). Default false. */
  appendOnly?: boolean;
}

const NATS_FALLBACKS = ["/usr/sbin/nats-server", "/usr/local/bin/nats-server", "/usr/bin/nats-server"];
const REDIS_FALLBACKS = ["/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"];
const READY_TIMEOUT_MS = 10_000;
const STOP_TIMEOUT_MS = 5_000;
const START_ATTEMPTS = 3;

// Children still running when the test process exits (or is ended by SIGTERM, as vitest ends
// its workers) are killed synchronously, so a crashed or interrupted test run never leaves
// servers behind.
const running = new Set<ChildProcess>();
const tempDirs = new Set<string>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  const cleanUp = () => {
    for (const child of running) child.kill("SIGKILL");
    for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
  };
  process.on("exit", cleanUp);
  // vitest ends a worker with SIGTERM, which skips "exit": clean up then too, and die of the
  // signal as before unless something else listens for it.
  process.once("SIGTERM", () => {
    cleanUp();
    if (process.listenerCount("SIGTERM") === 0) process.kill(process.pid, "SIGTERM");
  });
}

/** A short random namespace (`t_1a2b3c4d`) for Redis key prefixes and NATS stream/subject names. */
export function uniqueNamespace(prefix = "t"): string {
  return `${prefix}_${randomBytes(4).toString("hex")}`;
}

/**
 * Listening ports for the servers a test starts. A port is handed out, then bound by a child
 * process a few seconds later; in that gap nothing else may take it. So ports come from below the
 * kernel's ephemeral range (which every outgoing connection and every `listen(0)` draws from),
 * each test worker draws from a slice of its own (vitest's `VITEST_POOL_ID`; slice 0 for a process
 * outside vitest, such as the bench), and a process never hands out the same port twice until its
 * slice wraps. A port some other program already listens on is passed over.
 */
const PORT_FLOOR = 20_000;
const PORT_SLICES = 9;

function ephemeralFloor(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 0 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

interface PortSlice {
  first: number;
  size: number;
  next: number;
}

let slice: PortSlice | undefined;

function portSlice(): PortSlice | undefined {
  if (slice) return slice;
  const span = ephemeralFloor() - PORT_FLOOR;
  if (span < PORT_SLICES * 64) return undefined;
  const size = Math.floor(span / PORT_SLICES);
  const pool = Number(process.env["VITEST_POOL_ID"] ?? 0);
  const index = Number.isInteger(pool) && pool > 0 ? ((pool - 1) % (PORT_SLICES - 1)) + 1 : 0;
  // A random start, so a worker that runs the next test file does not retry the ports its last
  // file's servers may still hold in TIME_WAIT.
  slice = { first: PORT_FLOOR + index * size, size, next: Math.floor(Math.random() * size) };
  return slice;
}

/** Binds 127.0.0.1:port and closes it: the port number when that worked, else 0. */
function tryBind(port: number): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once("error", () => resolve(0));
    server.listen(port, "127.0.0.1", () => {
      const address = server.address();
      const bound = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(bound));
    });
  });
}

/** A TCP port on 127.0.0.1 that was free a moment ago and that this process has not handed out before. */
export async function freePort(): Promise<number> {
  const s = portSlice();
  if (s) {
    for (let tries = 0; tries < s.size; tries++) {
      const candidate = s.first + s.next;
      s.next = (s.next + 1) % s.size;
      if ((await tryBind(candidate)) === candidate) return candidate;
    }
  }
  // No room below the ephemeral range (or all of it busy): the kernel's pick.
  const port = await tryBind(0);
  if (port === 0) throw new Error("could not read a free port");
  return port;
}

/** The path of an executable: the first match on PATH, else the first existing fallback. */
function findBinary(name: string, fallbacks: readonly string[]): string | undefined {
  const dirs = (process.env["PATH"] ?? "").split(delimiter).filter(Boolean);
  for (const candidate of [...dirs.map((d) => join(d, name)), ...fallbacks]) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here; try the next one
    }
  }
  return undefined;
}

interface ServerSpec {
  /** Used in messages: "nats-server", "redis-server". */
  name: string;
  binary: string;
  args(port: number, dir: string): string[];
  /** Bytes to send once connected, if the server speaks only when spoken to. */
  probe?: string;
  /** The reply (prefix) that proves the server is ready to serve. */
  ready: string;
  scheme: string;
  /** `user:password` the server requires, put in its URL. */
  userinfo?: string;
}

/** Resolves once a TCP connection to the port receives `ready`; rejects on error or after the timeout. */
function probeOnce(port: number, spec: ServerSpec, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = new Socket();
    let received = "";
    const finish = (ok: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    socket.once("error", () => finish(false));
    socket.once("close", () => finish(false));
    socket.on("data", (data) => {
      received += data.toString("latin1");
      if (received.startsWith(spec.ready)) finish(true);
      else if (received.length >= spec.ready.length) finish(false);
    });
    socket.connect(port, "127.0.0.1", () => {
      if (spec.probe !== undefined) socket.write(spec.probe);
    });
  });
}

class PrivateServer {
  #child: ChildProcess | undefined;
  #output = "";
  readonly dir: string;

  constructor(
    readonly spec: ServerSpec,
    readonly port: number,
  ) {
    this.dir = mkdtempSync(join(tmpdir(), `tollgate-${spec.name}-`));
    tempDirs.add(this.dir);
  }

  get url(): string {
    const userinfo = this.spec.userinfo ? `${this.spec.userinfo}@` : "";
    return `${this.spec.scheme}://${userinfo}127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    installExitHook();
    this.#output = "";
    const child = spawn(this.spec.binary, this.spec.args(this.port, this.dir), {
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.#child = child;
    running.add(child);
    // Keep the tail of the server's output for the error message if it fails to start.
    const keep = (data: Buffer) => {
      this.#output = (this.#output + data.toString()).slice(-2_000);
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    let exited: string | undefined;
    let spawnError: Error | undefined;
    child.once("error", (err) => {
      spawnError = err;
    });
    child.once("exit", (code, signal) => {
      running.delete(child);
      exited = signal ?? `code ${code}`;
    });
    // The child's pipes must not keep the test process alive.
    child.unref();
    (child.stdout as unknown as Socket | null)?.unref();
    (child.stderr as unknown as Socket | null)?.unref();

    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (spawnError) throw new Error(`${this.spec.name} failed to start: ${spawnError.message}`);
      if (exited !== undefined) {
        throw new Error(
          `${this.spec.name} exited (${exited}) before accepting connections:\n${this.#output}`,
        );
      }
      if (await probeOnce(this.port, this.spec, 1_000)) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    await this.kill();
    throw new Error(
      `${this.spec.name} did not accept connections on 127.0.0.1:${this.port} within ${READY_TIMEOUT_MS} ms:\n${this.#output}`,
    );
  }

  /** Stops the process (SIGTERM, then SIGKILL) and waits for it to exit. */
  async kill(): Promise<void> {
    const child = this.#child;
    this.#child = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => child.kill("SIGKILL"), STOP_TIMEOUT_MS);
      child.once("exit", () => {
        clearTimeout(timer);
        resolve();
      });
      child.kill("SIGTERM");
    });
  }

  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
    tempDirs.delete(this.dir);
  }

  fixture(): ServerFixture {
    let stopped = false;
    return {
      url: this.url,
      shared: false,
      stop: async () => {
        stopped = true;
        await this.stop();
      },
      restart: async (opts = {}) => {
        if (stopped) throw new Error(`cannot restart a stopped ${this.spec.name}`);
        await this.kill();
        if (opts.downMs) await new Promise((r) => setTimeout(r, opts.downMs));
        await opts.until;
        await this.start();
      },
    };
  }
}

/** Starts a private server on a free port, retrying when another process takes the port first. */
async function startPrivate(spec: ServerSpec): Promise<ServerFixture> {
  let lastError: unknown;
  for (let attempt = 0; attempt < START_ATTEMPTS; attempt++) {
    const server = new PrivateServer(spec, await freePort());
    try {
      await server.start();
      return server.fixture();
    } catch (err) {
      lastError = err;
      await server.stop();
    }
  }
  throw lastError;
}

function sharedFixture(url: string): ServerFixture {
  return {
    url,
    shared: true,
    stop: async () => {},
    restart: async () => {
      throw new Error(`cannot restart a shared server (${url}); use a private fixture`);
    },
  };
}

function natsSpec(auth?: NatsAuth): ServerSpec {
  const binary = findBinary("nats-server", NATS_FALLBACKS);
  if (!binary) {
    throw new Error(
      "NATS is needed but neither NATS_URL is set nor a nats-server binary was found on PATH or at " +
        NATS_FALLBACKS.join(", "),
    );
  }
  return {
    name: "nats-server",
    binary,
    args: (port, dir) =>
      auth?.permissions
        ? ["-c", natsConfig(port, dir, auth)]
        : [
            "-a",
            "127.0.0.1",
            "-p",
            String(port),
            "-js",
            "-sd",
            dir,
            ...(auth ? ["--user", auth.user, "--pass", auth.pass] : []),
          ],
    // A NATS server greets every new connection with INFO once it is ready (before any login).
    ready: "INFO ",
    scheme: "nats",
    ...(auth ? { userinfo: `${encodeURIComponent(auth.user)}:${encodeURIComponent(auth.pass)}` } : {}),
  };
}

function redisSpec(appendOnly: boolean): ServerSpec {
  const binary = findBinary("redis-server", REDIS_FALLBACKS);
  if (!binary) {
    throw new Error(
      "Redis is needed but neither REDIS_URL is set nor a redis-server binary was found on PATH or at " +
        REDIS_FALLBACKS.join(", "),
    );
  }
  return {
    name: "redis-server",
    binary,
    args: (port, dir) => [
      "--bind",
      "127.0.0.1",
      "--port",
      String(port),
      "--save",
      "",
      "--appendonly",
      appendOnly ? "yes" : "no",
      "--dir",
      dir,
    ],
    // Redis accepts connections while it is still loading its data; only +PONG means ready.
    probe: "PING\r\n",
    ready: "+PONG",
    scheme: "redis",
  };
}

/** NATS with JetStream: NATS_URL when set, else a private nats-server on a free loopback port. */
export async function useNats(): Promise<NatsFixture> {
  const url = process.env["NATS_URL"];
  if (url) return sharedFixture(url);
  return privateNats();
}

/** A user and password a private nats-server requires (its fixture's URL carries them). */
export interface NatsAuth {
  user: string;
  pass: string;
  /** Subjects the user may publish and subscribe to; absent: all. */
  permissions?: { publish: readonly string[]; subscribe: readonly string[] };
}

/** A nats-server configuration file (in `dir`) for a user with permissions; its path. */
function natsConfig(port: number, dir: string, auth: NatsAuth): string {
  const q = JSON.stringify;
  const list = (subjects: readonly string[]) => `[${subjects.map((x) => q(x)).join(", ")}]`;
  const file = join(dir, "nats.conf");
  writeFileSync(
    file,
    [
      `listen: ${q(`127.0.0.1:${port}`)}`,
      `jetstream { store_dir: ${q(join(dir, "js"))} }`,
      "authorization {",
      `  users = [ { user: ${q(auth.user)}, password: ${q(auth.pass)}, permissions: {`,
      `    publish: ${list(auth.permissions!.publish)}, subscribe: ${list(auth.permissions!.subscribe)} } } ]`,
      "}",
      "",
    ].join("\n"),
  );
  return file;
}

/**
 * Always a private nats-server with JetStream, for tests that stop, restart or break it; with
 * `auth`, one that refuses any connection without that user and password.
 */
export async function privateNats(auth?: NatsAuth): Promise<NatsFixture> {
  return startPrivate(natsSpec(auth));
}

/** Redis: REDIS_URL when set (namespace your keys), else a private redis-server on a free loopback port. */
export async function useRedis(opts: RedisOptions = {}): Promise<RedisFixture> {
  const url = process.env["REDIS_URL"];
  if (url) return sharedFixture(url);
  return privateRedis(opts);
}

/** Always a private redis-server, for tests that stop, restart or break it. */
export async function privateRedis(opts: RedisOptions = {}): Promise<RedisFixture> {
  return startPrivate(redisSpec(opts.appendOnly ?? false));
}
