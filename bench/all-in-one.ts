// A small, bounded probe of the all-in-one process alone, for A/B runs of one change (`make
// bench` loads the whole machine for minutes): its memory under sustained load and the time to
// the first byte of a stream, against the fake upstream straight.
//
//   node --import tsx bench/all-in-one.ts                       # memory, then streams
//   AIO_PROBE=stream node --import tsx bench/all-in-one.ts      # streams only
//
// memory: buffered chats at AIO_CONNECTIONS (50) until each of AIO_POINTS (10000,50000,100000;
// 100k at most) requests in all; at each point, 1 s after its last request, VmRSS (the RSS the
// user sees) and process.memoryUsage() (heapUsed, external, arrayBuffers), then the same after a
// forced full GC through the inspector (AIO_GC=0: none, so later points are untouched by it).
// It also prints req/s and the gateway's CPU-ms per request of each stretch.
// AIO_SNAPSHOT=1 also writes heap snapshots at each point and prints what grew between them.
// stream: one stream at a time, AIO_STREAM_ROUNDS (6) rounds of AIO_STREAM_SECONDS (3 s)
// straight to the fake upstream then through the gateway, alternating; p50 of TTFB and TTFT.
// AIO_PROFILE=1 writes a CPU profile of the gateway over the stream rounds (open it in DevTools).
// AIO_NODE_FLAGS adds node flags to the gateway's (e.g. "--max-semi-space-size=4"), AIO_ENV
// adds environment variables ("MALLOC_ARENA_MAX=2"). Everything stays on 127.0.0.1; the run
// is bounded by AIO_SECONDS (300). It prints one JSON line per figure and a summary.

import { copyFileSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildBundles, REPO_ROOT } from "@tollgate/testkit/stack";
import { census, growth, type HeapCensus, Inspector } from "./lib/inspector.js";
import { cpuSecondsOf, memoryOf, type Runtime } from "./lib/procs.js";
import { bodies, cannon, streams, throughRequest } from "./lib/scenarios.js";
import { round, sleep } from "./lib/stats.js";
import { startAllInOne } from "./lib/targets.js";

const env = process.env;
const probe = env["AIO_PROBE"] || "memory,stream";
const points = (env["AIO_POINTS"] || "10000,50000,100000").split(",").map(Number);
if (points.some((p) => !Number.isInteger(p) || p < 1) || Math.max(...points) > 100_000)
  throw new Error("AIO_POINTS: whole numbers, 100000 at most");
const connections = Number(env["AIO_CONNECTIONS"] || 50);
const capSeconds = Math.min(Number(env["AIO_SECONDS"] || 300), 600);
const gcEach = env["AIO_GC"] !== "0";
const snapshots = env["AIO_SNAPSHOT"] === "1";
const profile = env["AIO_PROFILE"] === "1";
const rounds = Math.min(Number(env["AIO_STREAM_ROUNDS"] || 6), 20);
const streamSeconds = Math.min(Number(env["AIO_STREAM_SECONDS"] || 3), 10);
const nodeFlags = (env["AIO_NODE_FLAGS"] || "").split(" ").filter(Boolean);
const extraEnv = Object.fromEntries(
  (env["AIO_ENV"] || "")
    .split(" ")
    .filter(Boolean)
    .map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]),
);
const runtime = (env["BENCH_RUNTIME"] || "bundle") as Runtime;

const say = (msg: string) => process.stderr.write(`${msg}\n`);
const emit = (o: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(o)}\n`);

const stamp = new Date().toISOString().replace(/[:.]/g, "-");
const dir = join(REPO_ROOT, "bench/results", `all-in-one-${stamp}`);
mkdirSync(dir, { recursive: true });
// AIO_BUNDLE: a bundle built earlier (e.g. from the commit before a change, for an A/B), run in
// place of packages/all-in-one/dist/main.mjs instead of building one from this checkout.
const bundle = env["AIO_BUNDLE"];
if (bundle) copyFileSync(bundle, join(REPO_ROOT, "packages/all-in-one/dist/main.mjs"));
else if (runtime === "bundle") buildBundles(["packages/all-in-one"]);

const running = await startAllInOne(dir, ["--inspect=127.0.0.1:0", ...nodeFlags], runtime, extraEnv);
const started = performance.now();
const left = () => capSeconds - (performance.now() - started) / 1000;
try {
  const pid = running.processes.find((p) => p.role === "all-in-one")!.pid!;
  const inspector = await Inspector.attach(join(dir, "all-in-one.log"));
  const t = running.target;
  say(`all-in-one pid ${pid}, node flags [${nodeFlags.join(" ")}], env ${JSON.stringify(extraEnv)}`);
  emit({ point: "idle", vmRssMb: round(memoryOf(pid)!.rss), ...(await inspector.memory()) });

  if (probe.includes("stream")) {
    const req = throughRequest(t);
    const directUrl = `${t.upstreamUrl}/chat/completions`;
    const direct = () => streams(directUrl, {}, bodies.direct({ stream: true }), streamSeconds);
    const through = () => streams(req.url, req.headers, req.body({ stream: true }), streamSeconds);
    await direct();
    await through();
    if (profile) {
      await inspector.call("Profiler.enable");
      await inspector.call("Profiler.setSamplingInterval", { interval: 100 });
      await inspector.call("Profiler.start");
    }
    const added = { ttfb: [] as number[], ttft: [] as number[] };
    for (let i = 0; i < rounds; i++) {
      const d = await direct();
      const th = await through();
      added.ttfb.push(th.ttfb.latency.p50 - d.ttfb.latency.p50);
      added.ttft.push(th.ttft.latency.p50 - d.ttft.latency.p50);
      emit({
        round: i,
        directTtfbP50: round(d.ttfb.latency.p50),
        throughTtfbP50: round(th.ttfb.latency.p50),
        directTtftP50: round(d.ttft.latency.p50),
        throughTtftP50: round(th.ttft.latency.p50),
        streams: th.ttfb.latency.count,
        errors: th.ttfb.errors + th.ttfb.non2xx,
      });
    }
    if (profile) {
      const { profile: p } = (await inspector.call("Profiler.stop")) as { profile: unknown };
      const file = join(dir, "streams.cpuprofile");
      writeFileSync(file, JSON.stringify(p));
      say(`CPU profile of the stream rounds (direct and through, 100 µs sampling): ${file}`);
    }
    const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
    say(
      `stream: added TTFB p50 (median of ${rounds} rounds) ${round(median(added.ttfb))} ms, ` +
        `added TTFT ${round(median(added.ttft))} ms`,
    );
    emit({
      stream: "summary",
      addedTtfbP50: round(median(added.ttfb)),
      addedTtftP50: round(median(added.ttft)),
    });
  }

  if (probe.includes("memory")) {
    const req = throughRequest(t);
    const body = req.body();
    let answered = 0;
    let previous: HeapCensus | undefined;
    for (const aimedAt of points) {
      if (left() < 1) break;
      const cpuBefore = cpuSecondsOf(pid)!;
      const m = await cannon(req.url, body, req.headers, connections, Math.floor(left()), aimedAt - answered);
      answered += m.latency.count + m.non2xx;
      const cpuMsPerRequest = (1000 * (cpuSecondsOf(pid)! - cpuBefore)) / (m.latency.count + m.non2xx);
      await sleep(1000);
      const vmRssMb = round(memoryOf(pid)!.rss);
      const before = await inspector.memory();
      const point: Record<string, unknown> = {
        point: answered,
        vmRssMb,
        ...before,
        reqPerSec: round(m.reqPerSec),
        cpuMsPerRequest: round(cpuMsPerRequest),
        non2xx: m.non2xx,
        errors: m.errors,
      };
      if (gcEach || answered >= points.at(-1)!) {
        await inspector.gc();
        const after = await inspector.memory();
        point["afterGc"] = { vmRssMb: round(memoryOf(pid)!.rss), ...after };
      }
      emit(point);
      if (snapshots) {
        const file = join(dir, `heap-${answered}.heapsnapshot`);
        await inspector.snapshot(file);
        const c = census(file);
        if (previous)
          for (const g of growth(previous, c)) emit({ grew: g.label, count: g.count, bytes: g.bytes });
        previous = c;
      }
      say(`memory: ${answered} requests, VmRSS ${vmRssMb} MB, heapUsed ${before.heapUsed} MB`);
    }
  }
  inspector.close();
} finally {
  await running.stop();
  if (!snapshots && !profile && env["BENCH_KEEP_LOGS"] !== "1") rmSync(dir, { recursive: true, force: true });
  else say(`kept ${dir}`);
}
