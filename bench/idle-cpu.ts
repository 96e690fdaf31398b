// The CPU each process of the multi-process stack uses while it serves nothing (docs/operations.md,
// "Idle CPU"): the stack as `make bench` starts it (the bundles the images run, private NATS and
// Redis, two routers, the bench key), left alone for IDLE_SETTLE_SECONDS (5), then the CPU time
// of every process over IDLE_SECONDS (20), from /proc, in ms per second.
//
//   flock /tmp/bench.lock node --import tsx bench/idle-cpu.ts
//
// IDLE_BUILD=0 runs the bundles already in services/*/dist instead of building them.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildBundles, SERVICE_DIRS } from "@tollgate/testkit/stack";
import { RssTracker } from "./lib/procs.js";
import { sleep } from "./lib/stats.js";
import { startBenchStack } from "./lib/targets.js";

const settle = Math.min(Number(process.env["IDLE_SETTLE_SECONDS"] || 5), 60);
const seconds = Math.min(Number(process.env["IDLE_SECONDS"] || 20), 120);
if (process.env["IDLE_BUILD"] !== "0") buildBundles([...SERVICE_DIRS]);
const running = await startBenchStack(mkdtempSync(join(tmpdir(), "tollgate-idle-cpu-")), "bundle");
try {
  await sleep(settle * 1000);
  // The same CPU window make bench takes for each load point, here with no load.
  const tracker = new RssTracker("stack");
  for (const p of running.processes) tracker.track(p.name, p.pid, p.role, p.idleMb);
  const close = tracker.cpuWindow("idle");
  await sleep(seconds * 1000);
  const { gatewayCpuSeconds } = close();
  const percent = tracker.cpu[0]!.processes;
  console.log(`| process | CPU while idle, ms per s (${seconds} s after ${settle} s) |`);
  console.log("|---|---:|");
  // % of one core is 10 ms of CPU a second.
  for (const p of running.processes)
    console.log(`| ${p.name} | ${((percent[p.name] ?? Number.NaN) * 10).toFixed(1)} |`);
  console.log(
    `| (the stack: services, NATS and Redis) | ${((gatewayCpuSeconds * 1000) / seconds).toFixed(1)} |`,
  );
} finally {
  await running.stop();
}
