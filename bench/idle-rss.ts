// The idle RSS of each stack service, as `make bench` measures it (bench/lib/targets.ts): the
// multi-process stack started from the bundles the images run (with their node flags, from
// packages/config/src/topology.ts), on private NATS and Redis, and VmRSS of every service 1 s
// after the stack is ready, before any request. Small and bounded (about 10 s a round), for A/B
// runs of a memory change without the whole bench.
//
//   node --import tsx bench/idle-rss.ts
//
// IDLE_ROUNDS (3): stacks started one after another; the median of each service is printed.
// IDLE_BUILD=0 runs the bundles already in services/*/dist instead of building them.
// IDLE_DETAIL=1 also reads, inside each service at the same moment, process.memoryUsage(), V8's
// spaces and code statistics (bench/lib/memory-probe.mjs, preloaded through NODE_OPTIONS; the
// figures it prints are taken after the preload ran, so VmRSS is about 1 MB higher).
// IDLE_NODE_OPTIONS adds NODE_OPTIONS to every service (e.g. "--max-semi-space-size=2"), to try
// a flag before putting it in the topology; IDLE_ENV adds environment variables
// ("MALLOC_ARENA_MAX=2 GLIBC_TUNABLES=...").

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { useNats, useRedis } from "@tollgate/testkit/fixtures";
import { buildBundles, REPO_ROOT, SERVICE_DIRS, startStack } from "@tollgate/testkit/stack";
import { memoryOf } from "./lib/procs.js";
import { round, sleep, summarize } from "./lib/stats.js";

const env = process.env;
const rounds = Math.min(Math.max(Number(env["IDLE_ROUNDS"] || 3), 1), 10);
const detail = env["IDLE_DETAIL"] === "1";
const nodeOptions = [
  ...(detail ? [`--import=${join(REPO_ROOT, "bench/lib/memory-probe.mjs")}`] : []),
  ...(env["IDLE_NODE_OPTIONS"] || "").split(" ").filter(Boolean),
].join(" ");
// IDLE_ENV: more environment of every service ("NAME=value NAME2=value2").
const extraEnv: Record<string, string> = Object.fromEntries(
  (env["IDLE_ENV"] || "")
    .split(" ")
    .filter(Boolean)
    .map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]),
);
if (nodeOptions) extraEnv["NODE_OPTIONS"] = nodeOptions;
const HARNESS = new Set(["fake-upstream", "tempo-devnet"]);

const say = (msg: string) => process.stderr.write(`${msg}\n`);
/** RssAnon and RssFile of a process (MiB): the heap and malloc versus the mapped binary. */
function splitOf(pid: number): { anon: number; file: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
  return { anon: kb("RssAnon") / 1024, file: kb("RssFile") / 1024 };
}

if (env["IDLE_BUILD"] !== "0") {
  say("building the bundles ...");
  buildBundles(SERVICE_DIRS);
}
const nats = await useNats();
const redis = await useRedis();
const samples = new Map<string, number[]>();
try {
  for (let r = 1; r <= rounds; r++) {
    const stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace: `idle-${process.pid}-${r}`,
      routers: 2,
      edges: 1,
      runtime: "bundle",
      serviceEnv: extraEnv,
    });
    try {
      await sleep(1000);
      const services = stack.processes.filter((p) => !HARNESS.has(p.name) && p.child.pid !== undefined);
      const line: Record<string, unknown> = { round: r };
      for (const p of services) {
        const pid = p.child.pid!;
        const rss = memoryOf(pid)?.rss ?? Number.NaN;
        (samples.get(p.name) ?? samples.set(p.name, []).get(p.name)!).push(rss);
        line[p.name] = { rss, ...splitOf(pid) };
      }
      if (detail) {
        for (const p of services) p.child.kill("SIGUSR2");
        await sleep(300);
        for (const p of services) {
          try {
            const inside = JSON.parse(readFileSync(`/tmp/tollgate-memory-${p.child.pid}.json`, "utf8"));
            line[p.name] = { ...(line[p.name] as object), inside };
          } catch {
            // the probe did not answer in time
          }
        }
      }
      process.stdout.write(`${JSON.stringify(line, (_k, v) => (typeof v === "number" ? round(v) : v))}\n`);
    } finally {
      await stack.stop();
    }
  }
} finally {
  await redis.stop();
  await nats.stop();
}
say(`idle RSS (MiB), median of ${rounds} round(s), extra environment ${JSON.stringify(extraEnv)}:`);
for (const [name, values] of samples)
  say(
    `  ${name.padEnd(20)} ${summarize(values).p50.toFixed(1).padStart(6)}   [${values.map((v) => v.toFixed(1)).join(", ")}]`,
  );
