import { type ChildProcess, execFile, spawn } from "node:child_process";
import { accessSync, constants, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { promisify } from "node:util";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { Redis } from "ioredis";
import { freePort } from "./fixtures.js";

// Private Redis Clusters and NATS clusters for tests that fail a node over: every node is its
// own process from the installed binaries, on loopback ports, with its own scratch directory.
// Everything is killed (and its directory removed) on stop(), and when the test process exits.

const run = promisify(execFile);
const READY_TIMEOUT_MS = 20_000;

const running = new Set<ChildProcess>();
const scratch = new Set<string>();
let exitHook = false;

function installExitHook(): void {
  if (exitHook) return;
  exitHook = true;
  process.on("exit", () => {
    for (const child of running) child.kill("SIGKILL");
    for (const dir of scratch) rmSync(dir, { recursive: true, force: true });
  });
}

function binary(name: string, fallbacks: readonly string[]): string {
  const dirs = (process.env["PATH"] ?? "").split(delimiter).filter(Boolean);
  for (const candidate of [...dirs.map((d) => join(d, name)), ...fallbacks]) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here; try the next one
    }
  }
  throw new Error(`${name} is needed for a cluster test but was not found on PATH`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline)
      throw new Error(`${what} within ${timeoutMs} ms${last ? `: ${(last as Error).message}` : ""}`);
    await sleep(100);
  }
}

/** Free ports, distinct (freePort never hands out one twice). */
async function freePorts(n: number): Promise<number[]> {
  const ports: number[] = [];
  while (ports.length < n) ports.push(await freePort());
  return ports;
}

/** One server process of a cluster. */
class Node {
  #child: ChildProcess | undefined;
  #output = "";

  constructor(
    readonly name: string,
    readonly command: string,
    readonly args: string[],
  ) {}

  start(): void {
    installExitHook();
    this.#output = "";
    const child = spawn(this.command, this.args, { stdio: ["ignore", "pipe", "pipe"] });
    this.#child = child;
    running.add(child);
    const keep = (d: Buffer) => {
      this.#output = (this.#output + d.toString()).slice(-2_000);
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    child.once("exit", () => running.delete(child));
    child.unref();
    (child.stdout as unknown as { unref(): void } | null)?.unref();
    (child.stderr as unknown as { unref(): void } | null)?.unref();
  }

  get alive(): boolean {
    const c = this.#child;
    return c !== undefined && c.exitCode === null && c.signalCode === null;
  }

  get output(): string {
    return this.#output;
  }

  /** Stops the process (SIGKILL: a crash; SIGTERM: a clean stop) and waits for it to exit. */
  async kill(signal: "SIGKILL" | "SIGTERM" = "SIGKILL"): Promise<void> {
    const child = this.#child;
    if (!child || !this.alive) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
      child.once("exit", () => {
        clearTimeout(timer);
        resolve();
      });
      child.kill(signal);
    });
  }
}

/** One node of a Redis Cluster, as CLUSTER NODES shows it. */
export interface RedisClusterNode {
  port: number;
  id: string;
  role: "master" | "replica";
  /** A replica's master (node id). */
  masterId?: string;
  /** The node answers. */
  alive: boolean;
}

/** A running private Redis Cluster. */
export interface RedisClusterFixture {
  /** `redis+cluster://127.0.0.1:p1,…` over every node (what REDIS_URL takes). */
  url: string;
  /** Every node's client port, in start order. */
  ports: number[];
  /** The cluster as a live node sees it now. */
  nodes(): Promise<RedisClusterNode[]>;
  /** The port of the master that serves `key`'s slot now. */
  masterOf(key: string): Promise<number>;
  /** Kills one node (SIGKILL: a crash). */
  kill(port: number): Promise<void>;
  /**
   * Starts a killed node again with its cluster state; resolves once it has rejoined as a
   * replica (of the master promoted in its place) and finished its sync.
   */
  restart(port: number): Promise<void>;
  /**
   * Waits until the slots the killed master `port` served are served again (by its promoted
   * replica); returns how long that took since `since` (ms since the epoch).
   */
  waitForFailover(port: number, since: number, timeoutMs?: number): Promise<number>;
  stop(): Promise<void>;
}

/** Options of a private Redis Cluster. */
export interface RedisClusterOptions {
  /** Masters (default 3). */
  masters?: number;
  /** Replicas per master (default 1). */
  replicas?: number;
  /** cluster-node-timeout: how long a master may be unreachable before its replica takes over. Default 1000 ms. */
  nodeTimeoutMs?: number;
}

/**
 * Starts a Redis Cluster of `masters` masters with `replicas` replicas each, from the installed
 * redis-server (`--cluster-enabled yes`) and `redis-cli --cluster create`, on loopback ports.
 * Slots of a failing master stay its own problem (`cluster-require-full-coverage no`), and a
 * replica promotes however long it was cut off (`cluster-replica-validity-factor 0`).
 */
export async function startRedisCluster(opts: RedisClusterOptions = {}): Promise<RedisClusterFixture> {
  const masters = opts.masters ?? 3;
  const count = masters * (1 + (opts.replicas ?? 1));
  const server = binary("redis-server", ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]);
  const cli = binary("redis-cli", ["/usr/bin/redis-cli", "/usr/local/bin/redis-cli"]);
  const dir = mkdtempSync(join(tmpdir(), "tollgate-redis-cluster-"));
  scratch.add(dir);
  const allPorts = await freePorts(2 * count);
  const ports = allPorts.slice(0, count);
  const nodes = new Map<number, Node>();
  const clients = new Map<number, Redis>();
  const client = (port: number) => {
    let c = clients.get(port);
    if (!c) {
      c = new Redis({
        host: "127.0.0.1",
        port,
        lazyConnect: true,
        maxRetriesPerRequest: 0,
        retryStrategy: () => 200,
      });
      c.on("error", () => {});
      clients.set(port, c);
    }
    return c;
  };

  const stop = async () => {
    for (const c of clients.values()) c.disconnect();
    await Promise.all([...nodes.values()].map((n) => n.kill()));
    rmSync(dir, { recursive: true, force: true });
    scratch.delete(dir);
  };

  const nodesSeenBy = async (port: number): Promise<RedisClusterNode[]> => {
    const text = (await client(port).call("CLUSTER", "NODES")) as string;
    return text
      .trim()
      .split("\n")
      .map((line) => {
        const [id = "", address = "", flags = "", masterId = ""] = line.split(" ");
        const p = Number(address.split("@")[0]!.split(":")[1]);
        const isMaster = flags.split(",").includes("master");
        return {
          port: p,
          id,
          role: isMaster ? ("master" as const) : ("replica" as const),
          ...(isMaster ? {} : { masterId }),
          alive: !/fail/.test(flags),
        };
      });
  };
  const liveView = async () => {
    for (const p of ports) if (nodes.get(p)?.alive) return nodesSeenBy(p);
    throw new Error("no Redis Cluster node is alive");
  };

  try {
    ports.forEach((port, i) => {
      const node = new Node(`redis-${port}`, server, [
        "--bind",
        "127.0.0.1",
        "--port",
        String(port),
        "--cluster-enabled",
        "yes",
        "--cluster-port",
        String(allPorts[count + i]),
        "--cluster-config-file",
        join(dir, `nodes-${port}.conf`),
        "--cluster-node-timeout",
        String(opts.nodeTimeoutMs ?? 1_000),
        "--cluster-require-full-coverage",
        "no",
        "--cluster-replica-validity-factor",
        "0",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir,
        "--dbfilename",
        `dump-${port}.rdb`,
      ]);
      nodes.set(port, node);
      node.start();
    });
    await Promise.all(
      ports.map((p) =>
        until(`redis-server on ${p} did not answer PING`, READY_TIMEOUT_MS, async () =>
          (await client(p).ping()) === "PONG" ? true : undefined,
        ),
      ),
    );
    await run(
      cli,
      [
        "--cluster",
        "create",
        ...ports.map((p) => `127.0.0.1:${p}`),
        "--cluster-replicas",
        String(opts.replicas ?? 1),
        "--cluster-yes",
      ],
      { timeout: READY_TIMEOUT_MS },
    );
    // Ready: every node sees the cluster as ok, and every master has its replicas attached.
    await until("the Redis Cluster did not turn ok", READY_TIMEOUT_MS, async () => {
      for (const p of ports) {
        const info = (await client(p).call("CLUSTER", "INFO")) as string;
        if (!info.includes("cluster_state:ok")) return undefined;
      }
      const view = await nodesSeenBy(ports[0]!);
      const ms = view.filter((n) => n.role === "master");
      const ok =
        ms.length === masters &&
        ms.every((m) => view.filter((n) => n.masterId === m.id).length === (opts.replicas ?? 1));
      return ok ? true : undefined;
    });
    // Replicas finished their first sync, so a failover loses nothing written from now on.
    await until("the replicas did not finish their first sync", READY_TIMEOUT_MS, async () => {
      for (const p of ports) {
        const info = (await client(p).info("replication")) as string;
        if (info.includes("role:slave") && !info.includes("master_link_status:up")) return undefined;
      }
      return true;
    });
  } catch (err) {
    const tail = [...nodes.values()].map((n) => `${n.name}: ${n.output.slice(-300)}`).join("\n");
    await stop();
    throw new Error(`the Redis Cluster did not start: ${(err as Error).message}\n${tail}`);
  }

  return {
    url: `redis+cluster://${ports.map((p) => `127.0.0.1:${p}`).join(",")}`,
    ports,
    nodes: liveView,
    async masterOf(key) {
      const slot = (await client(ports.find((p) => nodes.get(p)?.alive)!).call(
        "CLUSTER",
        "KEYSLOT",
        key,
      )) as number;
      const shards = (await client(ports.find((p) => nodes.get(p)?.alive)!).call(
        "CLUSTER",
        "SLOTS",
      )) as Array<[number, number, [string, number, ...unknown[]], ...unknown[]]>;
      const shard = shards.find(([from, to]) => slot >= from && slot <= to);
      if (!shard) throw new Error(`no master serves slot ${slot}`);
      return Number(shard[2][1]);
    },
    async kill(port) {
      const node = nodes.get(port);
      if (!node) throw new Error(`no Redis Cluster node on ${port}`);
      clients.get(port)?.disconnect();
      clients.delete(port);
      await node.kill("SIGKILL");
    },
    async restart(port) {
      const node = nodes.get(port);
      if (!node) throw new Error(`no Redis Cluster node on ${port}`);
      await node.kill("SIGKILL");
      node.start();
      await until(`the node on ${port} did not rejoin as a synced replica`, READY_TIMEOUT_MS, async () => {
        const me = (await liveView()).find((n) => n.port === port);
        if (!me?.alive || me.role !== "replica") return undefined;
        const info = (await client(port).info("replication")) as string;
        return info.includes("master_link_status:up") ? true : undefined;
      });
    },
    async waitForFailover(port, since, timeoutMs = 20_000) {
      await until(`no replica took over from the master on ${port}`, timeoutMs, async () => {
        const view = await liveView();
        const dead = view.find((n) => n.port === port);
        const liveMasters = view.filter((n) => n.role === "master" && n.alive);
        // The dead master is marked failed and as many live masters serve as before.
        return dead && !dead.alive && liveMasters.length === masters ? true : undefined;
      });
      return Date.now() - since;
    },
    stop,
  };
}

/** A running private NATS cluster with JetStream. */
export interface NatsClusterFixture {
  /** Every node's client URL, comma-separated (what NATS_URL takes). */
  url: string;
  /** Every node's client port, in start order. */
  ports: number[];
  /** Kills one node (SIGKILL: a crash). */
  kill(port: number): Promise<void>;
  /** Starts a killed node again, with its store. */
  restart(port: number): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts a NATS cluster of `size` nodes (default 3), each with JetStream and its own store
 * directory, routed to each other, on loopback ports; ready once JetStream has a meta leader.
 */
export async function startNatsCluster(opts: { size?: number } = {}): Promise<NatsClusterFixture> {
  const size = opts.size ?? 3;
  const server = binary("nats-server", ["/usr/sbin/nats-server", "/usr/local/bin/nats-server"]);
  const dir = mkdtempSync(join(tmpdir(), "tollgate-nats-cluster-"));
  scratch.add(dir);
  const allPorts = await freePorts(2 * size);
  const ports = allPorts.slice(0, size);
  const routes = allPorts.slice(size);
  const nodes = new Map<number, Node>();
  ports.forEach((port, i) => {
    nodes.set(
      port,
      new Node(`nats-${i + 1}`, server, [
        "-a",
        "127.0.0.1",
        "-p",
        String(port),
        "-n",
        `tollgate-test-${i + 1}`,
        "-js",
        "-sd",
        join(dir, `node-${i + 1}`),
        "--cluster_name",
        "tollgate-test",
        "-cluster",
        `nats://127.0.0.1:${routes[i]}`,
        "-routes",
        routes
          .filter((_, j) => j !== i)
          .map((r) => `nats://127.0.0.1:${r}`)
          .join(","),
      ]),
    );
  });
  const url = ports.map((p) => `nats://127.0.0.1:${p}`).join(",");
  const stop = async () => {
    await Promise.all([...nodes.values()].map((n) => n.kill("SIGTERM")));
    rmSync(dir, { recursive: true, force: true });
    scratch.delete(dir);
  };
  try {
    for (const n of nodes.values()) n.start();
    await until("the NATS cluster did not elect a JetStream meta leader", READY_TIMEOUT_MS, async () => {
      const nc = await connect({ servers: url.split(","), timeout: 1_000, reconnect: false });
      try {
        const jsm = await jetstreamManager(nc, { timeout: 1_000 });
        await jsm.getAccountInfo();
        return true;
      } finally {
        await nc.close();
      }
    });
  } catch (err) {
    const tail = [...nodes.values()].map((n) => `${n.name}: ${n.output.slice(-300)}`).join("\n");
    await stop();
    throw new Error(`the NATS cluster did not start: ${(err as Error).message}\n${tail}`);
  }
  return {
    url,
    ports,
    async kill(port) {
      const node = nodes.get(port);
      if (!node) throw new Error(`no NATS node on ${port}`);
      await node.kill("SIGKILL");
    },
    async restart(port) {
      const node = nodes.get(port);
      if (!node) throw new Error(`no NATS node on ${port}`);
      await node.kill("SIGKILL");
      node.start();
    },
    stop,
  };
}
