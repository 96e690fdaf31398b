// `make bench`: Tollgate's overhead over the fake upstream it fronts, beside a peer gateway's
// (Portkey's open-source gateway, pinned in package.json) measured in the same run.
//
// For the all-in-one process, the peer and the multi-process stack (real NATS and Redis, two
// inference-routers, auth + rate limits + budgets + metering on), each scenario runs straight
// to a fake upstream, then through the gateway: buffered chat at 1/10/50 connections
// (autocannon, with the CPU the gateway's processes spent per request), streaming time to first
// byte, first token and chunk gaps, and (Tollgate only) the paid door with a reused voucher,
// then with a new voucher each request as mppx pays (node:http). With BENCH_LONG=1, the all-in-one and the peer also serve 100k requests, their
// RSS taken after 10k and 100k. It prints the tables, the figures beside the peer's, a PASS/FAIL
// line per target, and writes bench/results/<timestamp>.json and latest.json. Everything runs
// on 127.0.0.1, bounded in time: about four minutes with the defaults.
//
// Settings (environment): BENCH_DURATION (s per load point, 5), BENCH_WARMUP (s, 1),
// BENCH_CONNECTIONS (1,10,50), BENCH_MODES (all-in-one,portkey,stack), BENCH_RUNTIME (bundle:
// the esbuild bundles the images run, under plain node, built first; tsx: from source),
// BENCH_SCENARIOS (buffered,streaming,paid: which to run; `BENCH_SCENARIOS=paid
// BENCH_MODES=all-in-one,stack` is the paid-over-account figure alone, about a minute a mode),
// BENCH_LONG=1 (the memory soak, at most BENCH_SOAK_SECONDS per gateway, 240),
// BENCH_KEEP_LOGS=1 keeps the processes' logs under bench/results/logs-<timestamp>/.

import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, totalmem } from "node:os";
import { join } from "node:path";
import { buildBundles, REPO_ROOT, SERVICE_DIRS } from "@tollgate/testkit/stack";
import { type CpuRow, machineBusy, type RssRow, RssTracker, type Runtime } from "./lib/procs.js";
import {
  cpuTables,
  evaluatePeerTargets,
  evaluateTargets,
  peerFigures,
  peerTable,
  resultsTable,
  rssTable,
  targetsList,
} from "./lib/report.js";
import {
  buffered,
  type Mode,
  memorySoak,
  paidDoor,
  type Row,
  type Settings,
  type SoakPoint,
  sanityCheck,
  streaming,
} from "./lib/scenarios.js";
import { type Running, startAllInOne, startBenchStack, startPortkey, UPSTREAM_ENV } from "./lib/targets.js";
import { wakeCost } from "./lib/wake-cost.js";

function numberEnv(name: string, fallback: number, max: number): number {
  const raw = process.env[name];
  const v = raw === undefined || raw === "" ? fallback : Number(raw);
  if (!Number.isFinite(v) || v <= 0 || v > max) throw new Error(`${name} must be a number in (0, ${max}]`);
  return v;
}

const settings: Settings = {
  duration: numberEnv("BENCH_DURATION", 5, 30),
  warmup: numberEnv("BENCH_WARMUP", 1, 10),
  connections: (process.env["BENCH_CONNECTIONS"] || "1,10,50").split(",").map((c) => {
    const n = Number(c);
    if (!Number.isInteger(n) || n < 1 || n > 200) throw new Error("BENCH_CONNECTIONS: whole numbers 1..200");
    return n;
  }),
};
const runtimeSetting = process.env["BENCH_RUNTIME"] || "bundle";
if (runtimeSetting !== "bundle" && runtimeSetting !== "tsx") throw new Error("BENCH_RUNTIME: bundle or tsx");
const runtime: Runtime = runtimeSetting;
const modes = (process.env["BENCH_MODES"] || "all-in-one,portkey,stack")
  .split(",")
  .map((m) => m.trim()) as Mode[];
for (const m of modes)
  if (m !== "all-in-one" && m !== "stack" && m !== "portkey") throw new Error(`unknown mode ${m}`);
const SCENARIOS = ["buffered", "streaming", "paid"] as const;
const scenarios = new Set(
  (process.env["BENCH_SCENARIOS"] || SCENARIOS.join(",")).split(",").map((x) => x.trim()),
);
for (const x of scenarios)
  if (!(SCENARIOS as readonly string[]).includes(x)) throw new Error(`unknown scenario ${x}`);
const long = process.env["BENCH_LONG"] === "1";
const soakSeconds = numberEnv("BENCH_SOAK_SECONDS", 240, 900);

const stamp = new Date().toISOString().replace(/[:.]/g, "-");
const resultsDir = join(REPO_ROOT, "bench/results");
const logsDir = join(resultsDir, `logs-${stamp}`);
mkdirSync(logsDir, { recursive: true });
const say = (msg: string) => process.stderr.write(`${msg}\n`);
const load = () =>
  loadavg()
    .map((l) => l.toFixed(2))
    .join(" ");

const rows: Row[] = [];
const rss: RssRow[] = [];
const cpu: CpuRow[] = [];
const soak: SoakPoint[] = [];
const checks: Record<string, Record<string, string>> = {};
let running: Running | undefined;

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    say(`\n${signal}: stopping`);
    (running?.stop() ?? Promise.resolve()).finally(() => process.exit(130));
  });
}

if (runtime === "bundle") {
  say("building the bundles the images run (deploy/build/bundle.mjs)");
  buildBundles([...SERVICE_DIRS, "packages/all-in-one"]);
}

const HEADINGS: Record<Mode, string> = {
  "all-in-one": "all-in-one process (in-memory store and bus, bundled Tempo devnet)",
  portkey: "peer: Portkey's gateway (@portkey-ai/gateway, --headless, bound to 127.0.0.1)",
  stack: "multi-process stack (NATS JetStream, Redis, 2 inference-routers, 1 api-edge)",
};

async function measure(mode: Mode): Promise<void> {
  say(`\n== ${HEADINGS[mode]}`);
  running =
    mode === "all-in-one"
      ? await startAllInOne(logsDir, [], runtime)
      : mode === "portkey"
        ? await startPortkey(logsDir)
        : await startBenchStack(logsDir, runtime);
  try {
    const tracker = new RssTracker(mode);
    for (const p of running.processes) tracker.track(p.name, p.pid, p.role, p.idleMb);
    tracker.track("bench (load generator)", process.pid, "load");
    tracker.start();
    const target = running.target;
    checks[mode] = await sanityCheck(target);
    say(`  checks: ${JSON.stringify(checks[mode])}`);
    const probe = (loadPoint: string) => tracker.cpuWindow(loadPoint);
    if (scenarios.has("buffered")) rows.push(...(await buffered(target, settings, probe)));
    if (scenarios.has("streaming")) rows.push(...(await streaming(target, settings)));
    if (mode !== "portkey" && scenarios.has("paid")) {
      const paid = probe("paid door (seq.)");
      rows.push(...(await paidDoor(target, settings)));
      paid();
    }
    const main = running.processes.find((p) => p.role === "all-in-one" || p.role === "peer");
    if (long && main?.pid !== undefined)
      soak.push(...(await memorySoak(target, main.pid, [10_000, 100_000], soakSeconds)));
    rss.push(...tracker.finish());
    cpu.push(...tracker.cpu);
  } finally {
    await running.stop();
    running = undefined;
  }
}

async function main(): Promise<void> {
  const started = Date.now();
  const loadBefore = load();
  say(
    `Tollgate bench: ${settings.duration} s per load point after ${settings.warmup} s warm-up, ` +
      `connections ${settings.connections.join("/")}, modes ${modes.join(", ")}; ` +
      `${cpus().length} cores, load average ${loadBefore}`,
  );
  const busyBefore = await machineBusy(2000);
  say(`  machine busy before start: ${busyBefore.toFixed(0)} % of one core (2 s sample)`);
  if (busyBefore > 20) say("  note: other processes are busy on this machine; the figures will be noisier");
  const wake = await wakeCost();
  if (wake)
    say(
      `  a process waking here: one loopback round trip between two Node processes costs the caller ` +
        `${wake.backToBackUs.toFixed(0)} µs of CPU back to back, ${wake.afterIdleUs.toFixed(0)} µs after 1 ms asleep`,
    );
  for (const mode of modes) await measure(mode);

  const figures = peerFigures(rows, rss, soak, modes);
  const peerTargets = evaluatePeerTargets(figures);
  const targets = evaluateTargets(
    rows,
    rss,
    modes.filter((m) => m !== "portkey"),
  );
  process.stdout.write(
    [
      "",
      "Results (direct = straight to the fake upstream; overhead = the row − the row named in vs;",
      "stream rows: req/s = streams/s, p50/p99 = TTFT or the gap between content chunks)",
      resultsTable(rows),
      "",
      "Memory (MiB; idle = 1 s after ready, before any request; peak = VmHWM at the end)",
      rssTable(rss),
      "",
      "CPU during each load point (% of one core; 2 cores in all)",
      cpuTables(cpu),
      "",
      "Beside the peer (same run; added = through − direct; CPU: every process the gateway needs)",
      peerTable(figures),
      "",
      "Targets against the peer",
      targetsList(peerTargets),
      "",
      "Absolute targets",
      targetsList(targets),
      "",
    ].join("\n"),
  );

  const report = {
    startedAt: new Date(started).toISOString(),
    seconds: Math.round((Date.now() - started) / 1000),
    machine: {
      cpus: cpus().length,
      cpu: cpus()[0]?.model,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      loadAverageBefore: loadBefore,
      busyPercentBefore: Math.round(busyBefore),
      wakeCostUs: wake && {
        backToBack: Math.round(wake.backToBackUs),
        afterIdle: Math.round(wake.afterIdleUs),
      },
      loadAverageAfter: load(),
    },
    settings: { ...settings, modes, runtime, long, soakSeconds, upstream: UPSTREAM_ENV },
    checks,
    rows,
    rss,
    cpu,
    soak,
    figures,
    peerTargets,
    targets,
  };
  const json = `${JSON.stringify(report, null, 2)}\n`;
  writeFileSync(join(resultsDir, `${stamp}.json`), json);
  writeFileSync(join(resultsDir, "latest.json"), json);
  say(`wrote bench/results/${stamp}.json and bench/results/latest.json (${report.seconds} s)`);
}

try {
  await main();
} catch (err) {
  say(`bench failed: ${(err as Error).stack ?? String(err)}`);
  process.exitCode = 1;
} finally {
  if (process.env["BENCH_KEEP_LOGS"] !== "1" && process.exitCode !== 1)
    rmSync(logsDir, { recursive: true, force: true });
  else say(`logs kept in ${logsDir}`);
}
