// A paced caller against the multi-process stack (the `make up` stack, on free ports): after a few
// warm-up requests, one buffered chat request at a time with a pause between them, the way an
// agent with think time calls; prints each pause's p50, p99 and mean latency, and the lease calls
// (AcquireLease, ReturnLease) auth-policy served per measured request. It is what a lease
// kept across pauses is measured with (docs/performance.md, "Paced callers").
//
//   flock /tmp/bench.lock node --import tsx bench/paced.ts [--pauses 150,300] [--requests 60] [--warmup 5] [--burst 2000]
//
// First `--burst` requests back to back warm every process's JIT, as a gateway in service is:
// without them the first hundred requests run largely unoptimised code and a paced request took
// twice as long, which measured the JIT, not the pause.
//
// Needs NATS and Redis (NATS_URL, REDIS_URL; default the local ones).
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { uniqueNamespace } from "@tollgate/testkit/fixtures";
import { startStack } from "@tollgate/testkit/stack";
import { round, sleep, summarize } from "./lib/stats.js";

const { values } = parseArgs({
  options: {
    pauses: { type: "string", default: "150,300" },
    requests: { type: "string", default: "60" },
    warmup: { type: "string", default: "5" },
    burst: { type: "string", default: "2000" },
  },
});
const pauses = values.pauses.split(",").map(Number);
const requests = Number(values.requests);
const warmup = Number(values.warmup);
const burst = Number(values.burst);

const stack = await startStack({
  natsUrl: process.env.NATS_URL ?? "nats://127.0.0.1:4222",
  redisUrl: process.env.REDIS_URL ?? "redis://127.0.0.1:6379",
  namespace: uniqueNamespace("paced"),
  routers: 2,
  // Logs go to files: the caller's process stays quiet.
  logDir: mkdtempSync(join(tmpdir(), "tollgate-paced-")),
});

/** One buffered chat request; its latency in ms (the whole answer read). */
async function once(): Promise<number> {
  const started = performance.now();
  const res = await fetch(`${stack.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.demoKey}`, "content-type": "application/json" },
    body: JSON.stringify({ max_tokens: 8, messages: [{ role: "user", content: "hi" }] }),
  });
  await res.arrayBuffer();
  if (res.status !== 200) throw new Error(`status ${res.status}`);
  return performance.now() - started;
}

/** The lease calls auth-policy has served so far (its metrics). */
async function leaseCalls(): Promise<number> {
  const text = await (await fetch(stack.metricsUrls["auth-policy"]!)).text();
  let n = 0;
  for (const m of text.matchAll(/^tollgate_auth_calls_total\{([^}]*)\} (\S+)$/gm))
    if (/method="(acquireLease|returnLease)"/.test(m[1]!)) n += Number(m[2]);
  return n;
}

try {
  for (let i = 0; i < burst; i++) await once();
  for (const pause of pauses) {
    for (let i = 0; i < warmup; i++) {
      await once();
      await sleep(pause);
    }
    const ms: number[] = [];
    const callsBefore = await leaseCalls();
    for (let i = 0; i < requests; i++) {
      ms.push(await once());
      await sleep(pause);
    }
    const calls = (await leaseCalls()) - callsBefore;
    const s = summarize(ms);
    console.log(
      `pause ${pause} ms, ${s.count} requests: p50 ${round(s.p50)} ms, p99 ${round(s.p99)} ms, mean ${round(s.mean)} ms, ${round(calls / s.count)} lease calls a request`,
    );
  }
} finally {
  await stack.stop();
}
