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
import { cpuSecondsOf } from "./lib/procs.js";
import { sleep } from "./lib/stats.js";
import { startBenchStack } from "./lib/targets.js";

const settle = Math.min(Number(process.env["IDLE_SETTLE_SECONDS"] || 5), 60);
const seconds = Math.min(Number(process.env["IDLE_SECONDS"] || 20), 120);
if (process.env["IDLE_BUILD"] !== "0") buildBundles([...SERVICE_DIRS]);
const running = await startBenchStack(mkdtempSync(join(tmpdir(), "tollgate-idle-cpu-")), "bundle");
try {
  await sleep(settle * 1000);
  const measured = running.processes.filter((p) => p.pid !== undefined);
  const before = measured.map((p) => cpuSecondsOf(p.pid!) ?? Number.NaN);
  await sleep(seconds * 1000);
  const after = measured.map((p) => cpuSecondsOf(p.pid!) ?? Number.NaN);
  console.log(`| process | role | CPU while idle, ms per s (${seconds} s after ${settle} s) |`);
  console.log("|---|---|---:|");
  let total = 0;
  measured.forEach((p, i) => {
    const msPerSecond = ((after[i]! - before[i]!) * 1000) / seconds;
    if (p.role !== "harness") total += msPerSecond;
    console.log(`| ${p.name} | ${p.role} | ${msPerSecond.toFixed(1)} |`);
  });
  console.log(`| (the stack: services, NATS and Redis) | | ${total.toFixed(1)} |`);
} finally {
  await running.stop();
}
