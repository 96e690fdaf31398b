import { type ChildProcess, spawn } from "node:child_process";
import { openSync, readdirSync, readFileSync } from "node:fs";
import { commandOf, REPO_ROOT } from "@tollgate/testkit/stack";
import { sleep } from "./stats.js";

// Children this benchmark started, killed at exit whatever happens (never anything else).
const started = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of started)
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
});

/** How the gateway's processes run: from source under tsx, or the bundles the images ship. */
export type Runtime = "tsx" | "bundle";

/**
 * Runs an entry point of the repository, logging to a file: `node --import tsx <script>`, or
 * with runtime "bundle" a main's dist/main.mjs (see buildBundles in @tollgate/testkit/stack).
 */
export function spawnScript(
  script: string,
  env: NodeJS.ProcessEnv,
  logFile: string,
  nodeArgs: string[] = [],
  runtime: Runtime = "tsx",
): ChildProcess {
  const fd = openSync(logFile, "a");
  const child = spawn(process.execPath, [...nodeArgs, ...commandOf(script, runtime)], {
    cwd: REPO_ROOT,
    env: { PATH: process.env["PATH"], HOME: process.env["HOME"], ...env },
    stdio: ["ignore", fd, fd],
  });
  return track(child);
}

/** Kills `child` at exit if it is still running, like every process this benchmark starts. */
export function track(child: ChildProcess): ChildProcess {
  started.add(child);
  child.once("exit", () => started.delete(child));
  return child;
}

/** SIGTERM, then SIGKILL after `timeoutMs`; resolves once the process is gone. */
export function stopChild(child: ChildProcess, timeoutMs = 10_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

/** VmRSS and VmHWM (peak RSS) of a process, in MiB; undefined when it is gone. */
export function memoryOf(pid: number): { rss: number; hwm: number } | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
    return { rss: kb("VmRSS") / 1024, hwm: kb("VmHWM") / 1024 };
  } catch {
    return undefined;
  }
}

/** CPU seconds (user + system) a process has used so far; undefined when it is gone. */
export function cpuSecondsOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces) start at state; utime and stime are
    // fields 14 and 15 of the whole line, in clock ticks (100 per second on Linux).
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return undefined;
  }
}
const CLOCK_TICKS = 100;

/** Busy and total CPU seconds of the whole machine (all cores), from /proc/stat. */
function machineCpu(): { busy: number; total: number } {
  const line = readFileSync("/proc/stat", "utf8").split("\n")[0]!;
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  const total = v.reduce((a, b) => a + b, 0);
  const idle = (v[3] ?? 0) + (v[4] ?? 0);
  return { busy: (total - idle) / CLOCK_TICKS, total: total / CLOCK_TICKS };
}

/** How busy the machine is over `ms` (% of one core; 200 = both cores), before the bench runs. */
export async function machineBusy(ms: number): Promise<number> {
  const a = machineCpu();
  await sleep(ms);
  const b = machineCpu();
  return (100 * (b.busy - a.busy)) / (ms / 1000);
}

/** CPU use of each followed process during one load point, in % of one core. */
export interface CpuRow {
  mode: string;
  loadPoint: string;
  seconds: number;
  /** Process name → % of one core. */
  processes: Record<string, number>;
  /** CPU seconds of the gateway's processes: services, all-in-one, NATS and Redis, the peer. */
  gatewayCpuSeconds: number;
  /** Everything else on the machine (other sessions' work, the kernel), % of one core. */
  others: number;
  /** The whole machine, % of one core (200 = both cores busy). */
  machine: number;
}

/** The pid of the first process whose argv satisfies `match` (e.g. the nats-server on a port). */
export function findPid(match: (argv: string[]) => boolean): number | undefined {
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0").filter(Boolean);
      if (match(argv)) return Number(entry);
    } catch {
      // gone meanwhile
    }
  }
  return undefined;
}

/**
 * What a process is, for the RSS table, the idle-RSS target and CPU per request (which sums
 * service, all-in-one, infra and peer: the processes a gateway needs, not the bench's harness).
 */
export type Role = "service" | "all-in-one" | "harness" | "infra" | "load" | "peer";
const GATEWAY_ROLES: ReadonlySet<Role> = new Set(["service", "all-in-one", "infra", "peer"]);

export interface RssRow {
  mode: string;
  process: string;
  role: Role;
  pid: number;
  /** VmRSS right after start, before any load (MiB). */
  idleMb: number;
  /** Highest VmRSS seen by periodic sampling (MiB). */
  sampledPeakMb: number;
  /** VmHWM at the end: the kernel's peak RSS of the process (MiB). */
  peakMb: number;
}

/** Samples the memory of a set of processes: idle once, then every 250 ms until finish(). */
export class RssTracker {
  readonly #rows: RssRow[] = [];
  readonly cpu: CpuRow[] = [];
  #timer: NodeJS.Timeout | undefined;

  constructor(readonly mode: string) {}

  /** Starts following a process; `idleMb` is its idle RSS if sampled earlier, else now. */
  track(name: string, pid: number | undefined, role: Role, idleMb?: number): void {
    if (pid === undefined) return;
    const m = memoryOf(pid);
    this.#rows.push({
      mode: this.mode,
      process: name,
      role,
      pid,
      idleMb: idleMb ?? m?.rss ?? Number.NaN,
      sampledPeakMb: m?.rss ?? Number.NaN,
      peakMb: m?.hwm ?? Number.NaN,
    });
  }

  start(): void {
    this.#timer = setInterval(() => this.#sample(), 250);
    this.#timer.unref();
  }

  #sample(): void {
    for (const row of this.#rows) {
      const m = memoryOf(row.pid);
      if (m && !(m.rss <= row.sampledPeakMb)) row.sampledPeakMb = m.rss;
      if (m) row.peakMb = m.hwm;
    }
  }

  /** Starts a CPU window; the returned function closes it and records a {@link CpuRow}. */
  cpuWindow(loadPoint: string): () => { seconds: number; gatewayCpuSeconds: number } {
    const started = performance.now();
    const machine = machineCpu();
    const before = this.#rows.map((r) => cpuSecondsOf(r.pid) ?? Number.NaN);
    return () => {
      const seconds = (performance.now() - started) / 1000;
      const m = machineCpu();
      const processes: Record<string, number> = {};
      let ours = 0;
      let gateway = 0;
      this.#rows.forEach((r, i) => {
        const used = (cpuSecondsOf(r.pid) ?? Number.NaN) - before[i]!;
        processes[r.process] = (100 * used) / seconds;
        if (!Number.isNaN(used)) ours += used;
        if (!Number.isNaN(used) && GATEWAY_ROLES.has(r.role)) gateway += used;
      });
      const busy = m.busy - machine.busy;
      this.cpu.push({
        mode: this.mode,
        loadPoint,
        seconds,
        processes,
        gatewayCpuSeconds: gateway,
        others: Math.max(0, (100 * (busy - ours)) / seconds),
        machine: (100 * busy) / seconds,
      });
      return { seconds, gatewayCpuSeconds: gateway };
    };
  }

  /** Takes the last sample (call before stopping the processes) and stops sampling. */
  finish(): RssRow[] {
    this.#sample();
    clearInterval(this.#timer);
    return this.#rows;
  }
}
