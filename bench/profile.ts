// CPU profile of one Tollgate process under the bench load, to see what the figures show:
//
//   PROFILE_TARGET=api-edge npx tsx bench/profile.ts
//
// PROFILE_TARGET: api-edge (default), auth-policy, inference-router, metering, mpp-payment (one
// process of the multi-process stack, restarted in place with `node --cpu-prof`), or all-in-one.
// Buffered account-door chat at PROFILE_CONNECTIONS (10) for PROFILE_SECONDS (10, at most 30)
// after a 3 s warm-up; PROFILE_DOOR=paid drives the paid door instead (sequential PaidSession
// requests reusing one voucher, for mpp-payment; PROFILE_VOUCHER=new signs a new, higher voucher
// for every request, the way mppx's session manager pays). Prints the top self-time frames and
// areas of the load window only (on the paid door also the paid requests' p50 and the target's
// CPU per paid request and per Verify), and keeps the .cpuprofile (open it in Chrome DevTools)
// under bench/results/profiles/.
//
// Every process runs as the bench runs it (PROFILE_RUNTIME=bundle, the default: the images'
// esbuild bundles with their node flags; tsx for source), and each frame of a bundle is named by
// its source file and line through the bundle's source map.

import { randomBytes } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { SourceMap } from "node:module";
import { dirname, join, relative, resolve } from "node:path";
import { PaidSession } from "@tollgate/agent-client";
import { dialEnv, SERVICE_NAMES, type ServiceName, TOPOLOGY } from "@tollgate/config/topology";
import { DEMO_PAYEE_PRIVATE_KEY, DEMO_PAYER_PRIVATE_KEY } from "@tollgate/demo/tempo-devnet";
import { buildBundles, REPO_ROOT, SERVICE_DIRS, waitForPort, waitForReady } from "@tollgate/testkit/stack";
import autocannon from "autocannon";
import { timedFetch } from "./lib/http.js";
import { cpuSecondsOf, type Runtime, spawnScript, stopChild } from "./lib/procs.js";
import { bodies } from "./lib/scenarios.js";
import { type Running, type RunningStack, startAllInOne, startBenchStack } from "./lib/targets.js";

const TARGETS: string[] = [...SERVICE_NAMES, "all-in-one"];
const target = process.env["PROFILE_TARGET"] || "api-edge";
if (!TARGETS.includes(target)) throw new Error(`PROFILE_TARGET is one of ${TARGETS.join(", ")}`);
const seconds = Math.min(30, Number(process.env["PROFILE_SECONDS"] || 10));
const connections = Math.min(200, Number(process.env["PROFILE_CONNECTIONS"] || 10));
const door = process.env["PROFILE_DOOR"] || "account";
if (door !== "account" && door !== "paid") throw new Error("PROFILE_DOOR is account or paid");
const voucher = process.env["PROFILE_VOUCHER"] || "reuse";
if (voucher !== "reuse" && voucher !== "new") throw new Error("PROFILE_VOUCHER is reuse or new");
const runtime = (process.env["PROFILE_RUNTIME"] || "bundle") as Runtime;
if (runtime !== "bundle" && runtime !== "tsx") throw new Error("PROFILE_RUNTIME is bundle or tsx");

const stamp = new Date().toISOString().replace(/[:.]/g, "-");
const resultsDir = join(REPO_ROOT, "bench/results");
const logsDir = join(resultsDir, `logs-profile-${stamp}`);
const profDir = join(logsDir, "cpuprof");
mkdirSync(profDir, { recursive: true });
const say = (msg: string) => process.stderr.write(`${msg}\n`);
const nowUs = () => Number(process.hrtime.bigint() / 1000n);
const CPU_PROF = ["--cpu-prof", "--cpu-prof-dir", profDir];

/** Restarts one stack process in place (same port and settings) under `node --cpu-prof`. */
async function profileInStack(
  s: RunningStack,
  name: string,
): Promise<{ stop: () => Promise<void>; pid: number | undefined }> {
  const proc = s.stack.processes.find((p) => p.name === name);
  if (!proc) throw new Error(`no stack process ${name}`);
  const script = (name.startsWith("inference-router") ? "inference-router" : name) as ServiceName;
  const common = {
    TOLLGATE_CONFIG: s.configPath,
    NATS_URL: s.natsUrl,
    REDIS_URL: s.redisUrl,
    NATS_NAMESPACE: s.namespace,
    REDIS_PREFIX: `tollgate:${s.namespace}:`,
    LOG_LEVEL: "info",
    GRPC_HOST: "127.0.0.1",
    METRICS_HOST: "127.0.0.1",
    METRICS_PORT: "0",
    // The stack's per-service internal tokens (packages/testkit/src/internal-auth.ts).
    INTERNAL_TOKEN_FILE: join(s.stack.dir, "internal-auth", `${script}.token`),
    INTERNAL_PEER_TOKENS_FILE: join(s.stack.dir, "internal-auth", "peers"),
  };
  // Its peers' addresses in the variables the topology names (every replica the stack runs).
  const peers = (peer: ServiceName) =>
    s.stack.processes
      .filter((p) => p.name === peer || p.name.startsWith(`${peer}-`))
      .map((p) => `127.0.0.1:${p.port}`);
  const own: Record<string, Record<string, string>> = {
    "api-edge": {
      HOST: "127.0.0.1",
      PORT: String(proc.port),
      ADMIN_HOST: "127.0.0.1",
      ADMIN_PORT: new URL(s.stack.adminUrls[0]!).port,
      ADMIN_TOKEN: s.stack.adminToken,
    },
    "mpp-payment": {
      GRPC_PORT: String(proc.port),
      TEMPO_RPC_URL: s.stack.tempoRpcUrl,
      MPP_SECRET: randomBytes(32).toString("hex"),
      MPP_PAYEE_KEY: DEMO_PAYEE_PRIVATE_KEY,
    },
  };
  await s.stack.stopProcess(name);
  const child = spawnScript(
    `services/${script}/src/main.ts`,
    { ...common, ...(own[name] ?? { GRPC_PORT: String(proc.port) }), ...dialEnv(script, peers) },
    join(logsDir, `${name}-profiled.log`),
    // The node flags its image runs with (young-generation size, --expose-gc), so that the
    // profile's garbage collection is the deployed one's; a bundle's command carries them.
    runtime === "bundle" ? CPU_PROF : [...TOPOLOGY[script].nodeFlags, ...CPU_PROF],
    runtime,
  );
  await waitForPort(proc.port);
  if (name === "api-edge") await waitForReady(s.target.gatewayUrl, 60_000);
  say(`  ${name} restarted under --cpu-prof (pid ${child.pid})`);
  return { stop: () => stopChild(child, 20_000), pid: child.pid };
}

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

/**
 * A frame's source file (absolute path or node: URL) and 0-based line: for a frame in a bundle
 * (…/dist/main.mjs), the original file and line its source map names; else the frame's own.
 */
function sourceResolver(): (url: string, line: number, column: number) => { path: string; line: number } {
  const maps = new Map<string, SourceMap | undefined>();
  const mapOf = (path: string) => {
    if (!maps.has(path)) {
      let map: SourceMap | undefined;
      try {
        map = new SourceMap(JSON.parse(readFileSync(`${path}.map`, "utf8")));
      } catch {
        map = undefined;
      }
      maps.set(path, map);
    }
    return maps.get(path);
  };
  return (url, line, column) => {
    const path = url.replace(/^file:\/\//, "");
    const map = path.endsWith("/dist/main.mjs") ? mapOf(path) : undefined;
    const entry = map?.findEntry(line, column);
    if (!entry || !("originalSource" in entry)) return { path, line };
    return { path: resolve(dirname(path), entry.originalSource), line: entry.originalLine };
  };
}

/** Where a frame's code lives: a package, a service, node's internals, or V8's own buckets. */
function area(url: string, fn: string): string {
  if (!url) return fn.startsWith("(") ? fn : "(native)";
  const path = url.replace(/^file:\/\//, "");
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(path)?.[1];
  if (pkg) return pkg;
  if (path.startsWith("node:internal/")) return path.split("/").slice(0, 2).join("/");
  if (path.startsWith("node:")) return path;
  const rel = relative(REPO_ROOT, path);
  return rel.startsWith("..") ? path : rel.split("/").slice(0, 2).join("/");
}

/** Paid requests in the window and their paid legs' times (ms), on the paid door. */
interface PaidWindow {
  requests: number;
  paidMs: number[];
  /** CPU seconds the profiled process used in the window (/proc/<pid>/stat), when known. */
  cpuSeconds: number | undefined;
}

function analyse(file: string, fromUs: number, toUs: number, paid?: PaidWindow): void {
  const profile = JSON.parse(readFileSync(file, "utf8")) as CpuProfile;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const sourceOf = sourceResolver();
  const keyOf = (node: ProfileNode) => {
    const { functionName, url, lineNumber, columnNumber } = node.callFrame;
    if (!url) return functionName || "(anonymous)";
    const src = sourceOf(url, lineNumber, columnNumber);
    const where = src.path.startsWith("node:") ? src.path : relative(REPO_ROOT, src.path);
    return `${functionName || "(anonymous)"} ${where}:${src.line + 1}`;
  };
  const self = new Map<string, number>();
  // Inclusive time: each sample counts once for every distinct frame on its stack.
  const inclusive = new Map<string, number>();
  const areas = new Map<string, number>();
  let t = profile.startTime;
  let total = 0;
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i] ?? 0;
    const delta = profile.timeDeltas[i + 1] ?? 0;
    if (t < fromUs || t > toUs) continue;
    const node = byId.get(profile.samples[i]!);
    if (!node) continue;
    const key = keyOf(node);
    self.set(key, (self.get(key) ?? 0) + delta);
    const seen = new Set<string>();
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const k = keyOf(byId.get(id)!);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + delta);
    }
    const { functionName, url, lineNumber, columnNumber } = node.callFrame;
    const a = area(url ? sourceOf(url, lineNumber, columnNumber).path : "", functionName);
    areas.set(a, (areas.get(a) ?? 0) + delta);
    total += delta;
  }
  const top = (m: Map<string, number>, n: number) =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(
        ([k, v]) =>
          `  ${((100 * v) / total).toFixed(1).padStart(5)} %  ${(v / 1000).toFixed(0).padStart(6)} ms  ${k}`,
      )
      .join("\n");
  const idle = self.get("(idle)") ?? 0;
  // Our own code (services/, packages/) by inclusive time: where a request's CPU goes.
  const ours = new Map([...inclusive].filter(([k]) => / (services|packages)\//.test(k)));
  let perPaid = "";
  if (paid && paid.requests > 0) {
    const sorted = [...paid.paidMs].sort((a, b) => a - b);
    const p50 = sorted[Math.floor((sorted.length - 1) / 2)] ?? Number.NaN;
    // The domain's Verify (verify.ts, and payments.ts's wrapper of the same name that includes it):
    // the credential checks, the store step and the answer's receipt, without gRPC around them.
    const verify = Math.max(
      0,
      ...[...inclusive].filter(([k]) => /^verifyAndReserve /.test(k)).map(([, v]) => v),
    );
    perPaid =
      `paid requests: ${paid.requests} (${voucher === "new" ? "a new voucher each" : "one voucher reused"}), ` +
      `paid leg p50 ${p50.toFixed(3)} ms; ${target} CPU ${((total - idle) / 1000 / paid.requests).toFixed(3)} ms ` +
      `per paid request, verifyAndReserve ${(verify / 1000 / paid.requests).toFixed(3)} ms per Verify\n` +
      (paid.cpuSeconds === undefined
        ? ""
        : `${target} CPU time (/proc/<pid>/stat, not profiler samples): ` +
          `${((paid.cpuSeconds * 1000) / paid.requests).toFixed(3)} ms per paid request\n`);
  }
  process.stdout.write(
    `\nCPU profile of ${target}, ${door} door, ${door === "paid" ? 1 : connections} connections, ${seconds} s window: ` +
      `${(total / 1000).toFixed(0)} ms sampled, ${((100 * (total - idle)) / total).toFixed(1)} % busy\n${perPaid}` +
      `\nTop self-time frames\n${top(self, 25)}\n\nBy area (package, service or V8 bucket)\n${top(areas, 15)}\n` +
      `\nTollgate code by inclusive time (the frame and everything it calls)\n${top(ours, 20)}\n`,
  );
}

async function main(): Promise<void> {
  say(
    `profiling ${target}: ${door} door, ${door === "paid" ? 1 : connections} connections for ${seconds} s (${runtime})`,
  );
  if (runtime === "bundle") buildBundles([...SERVICE_DIRS, "packages/all-in-one"]);
  let running: Running | undefined;
  let stopProfiled: () => Promise<void> = async () => {};
  let profiledPid: number | undefined;
  try {
    if (target === "all-in-one") {
      const aio = await startAllInOne(logsDir, CPU_PROF, runtime);
      running = aio;
      // A graceful stop: the profile is written when the process exits.
      stopProfiled = () => aio.stop();
    } else {
      const s = await startBenchStack(logsDir, runtime);
      running = s;
      const profiled = await profileInStack(s, target === "inference-router" ? "inference-router-1" : target);
      stopProfiled = profiled.stop;
      profiledPid = profiled.pid;
    }
    const t = running.target;
    let from: number;
    let to: number;
    let paidWindow: PaidWindow | undefined;
    if (door === "paid") {
      let recording = false;
      const paidMs: number[] = [];
      const session = new PaidSession({
        url: t.gatewayUrl,
        privateKey: DEMO_PAYER_PRIVATE_KEY,
        rpcUrl: t.rpcUrl,
        maxDeposit: 50_000_000n,
        voucherEachRequest: voucher === "new",
        fetch: timedFetch((e) => {
          if (recording && e.paid) paidMs.push(e.ms);
        }),
      });
      const paidFor = async (s: number) => {
        let n = 0;
        const end = performance.now() + s * 1000;
        for (; n < 20_000 && performance.now() < end; n++) await session.chat(bodies.paid());
        return n;
      };
      await paidFor(3);
      recording = true;
      const cpuFrom = profiledPid === undefined ? undefined : cpuSecondsOf(profiledPid);
      from = nowUs();
      const n = await paidFor(seconds);
      to = nowUs();
      const cpuTo = profiledPid === undefined ? undefined : cpuSecondsOf(profiledPid);
      recording = false;
      const cpuSeconds = cpuFrom === undefined || cpuTo === undefined ? undefined : cpuTo - cpuFrom;
      paidWindow = { requests: n, paidMs, cpuSeconds };
      say(`  ${n} paid requests (${Math.round(n / seconds)} req/s), one connection`);
    } else {
      const opts = {
        url: `${t.gatewayUrl}/v1/chat/completions`,
        method: "POST",
        body: bodies.through(),
        headers: { "content-type": "application/json", authorization: `Bearer ${t.key}` },
        connections,
      };
      await autocannon({ ...opts, duration: 3 });
      from = nowUs();
      const result = await autocannon({ ...opts, duration: seconds });
      to = nowUs();
      say(
        `  ${result.requests.total} requests (${Math.round(result.requests.total / result.duration)} req/s), ` +
          `${result.non2xx} non-2xx, ${result.errors} errors`,
      );
    }
    await stopProfiled();
    // The profile is written once the profiled process exited; the rest of the stack stops after
    // the analysis (with auth-policy profiled, api-edge's stop retries returning its leases to the
    // auth-policy that is gone, and nothing else would keep this process waiting for it).
    // CPU.<date>.<time>.<pid>.<thread>.<seq>.cpuprofile: the main thread is 0 (tsx's loader
    // runs in a worker thread, which writes its own profile).
    const file = readdirSync(profDir)
      .filter((f) => /^CPU\.\d+\.\d+\.\d+\.0\.\d+\.cpuprofile$/.test(f))
      .map((f) => join(profDir, f))
      .at(-1);
    if (!file) throw new Error("no .cpuprofile was written");
    analyse(file, from, to, paidWindow);
    const keep = join(resultsDir, "profiles");
    mkdirSync(keep, { recursive: true });
    const kept = join(keep, `${target}-${stamp}.cpuprofile`);
    renameSync(file, kept);
    say(`\nprofile kept: ${relative(REPO_ROOT, kept)}`);
    // The stack's children do not keep this process alive: a timer does, while they stop.
    const alive = setInterval(() => {}, 1_000);
    await running.stop().finally(() => clearInterval(alive));
    running = undefined;
  } finally {
    await stopProfiled().catch(() => {});
    await running?.stop();
    if (process.env["BENCH_KEEP_LOGS"] !== "1") rmSync(logsDir, { recursive: true, force: true });
  }
}

await main();
