import { PaidSession } from "@tollgate/agent-client";
import { DEMO_PAYER_PRIVATE_KEY } from "@tollgate/testkit/tempo-devnet";
import autocannon from "autocannon";
import { type Exchange, send, streamOnce, timedFetch } from "./http.js";
import { memoryOf } from "./procs.js";
import { round, type Summary, sleep, summarize } from "./stats.js";

/** Tollgate's two ways to run, and the peer gateway measured beside them. */
export type Mode = "all-in-one" | "stack" | "portkey";

/** A gateway under test and the fake upstream it is pointed at. */
export interface Target {
  mode: Mode;
  /** Base URL of api-edge, e.g. http://127.0.0.1:8080. */
  gatewayUrl: string;
  /** Base URL of the fake upstream, ending in /v1. */
  upstreamUrl: string;
  /** The bench key: a connection with rate limits and a budget (empty for the peer). */
  key: string;
  /** Tempo devnet JSON-RPC, for the paid door's open transaction (empty for the peer). */
  rpcUrl: string;
  /**
   * For a peer gateway: the headers that route its requests to the fake upstream, in place of
   * Tollgate's bench key; its requests name the upstream's model, as a direct request does.
   */
  peerHeaders?: Record<string, string>;
  /** The gateway's Prometheus endpoint, when it serves one (the all-in-one): its heap in use. */
  metricsUrl?: string;
}

/** A chat through the gateway: its URL, headers (without content-type) and body. */
export function throughRequest(t: Target): {
  url: string;
  headers: Record<string, string>;
  body: (extra?: Record<string, unknown>) => string;
} {
  const url = `${t.gatewayUrl}/v1/chat/completions`;
  if (t.peerHeaders) return { url, headers: t.peerHeaders, body: bodies.direct };
  return { url, headers: { authorization: `Bearer ${t.key}` }, body: bodies.through };
}

/** CPU of one load point: the gateway's processes (with NATS and Redis for the stack). */
export interface CpuWindow {
  seconds: number;
  /** CPU seconds the gateway's processes used during the window. */
  gatewayCpuSeconds: number;
}

/** Opens a CPU accounting window for a load point; the returned function closes it. */
export type CpuProbe = (loadPoint: string) => () => CpuWindow;

export interface Settings {
  /** Seconds of each measured load point. */
  duration: number;
  /** Seconds of warm-up before each load point. */
  warmup: number;
  connections: number[];
}

/** One line of the results table. */
export interface Row {
  mode: string;
  scenario: string;
  /** direct (straight to the fake upstream), through (Tollgate), paid, account. */
  side: "direct" | "through" | "account" | "paid" | "paid-total";
  conns: number;
  reqPerSec: number | null;
  p50: number;
  p99: number;
  mean: number;
  count: number;
  non2xx: number;
  errors: number;
  /** This row minus `vs` (ms), at p50 and p99. */
  overheadP50: number | null;
  overheadP99: number | null;
  vs: string | null;
  statusCodes: Record<string, number>;
  /**
   * CPU milliseconds per answered request, summed over the gateway's processes (the stack's
   * services with NATS and Redis; the all-in-one process; the peer's process); null when not
   * measured.
   */
  cpuMsPerRequest?: number | null;
  /**
   * CPU milliseconds per second the gateway's processes (as for cpuMsPerRequest) used while the
   * load point before this one went straight to the upstream: the gateway idle, its timers only.
   */
  idleCpuMsPerSec?: number | null;
}

const PROMPT = "Say hello to the benchmark";
const MAX_TOKENS = 16;

export const bodies = {
  direct: (extra: Record<string, unknown> = {}) =>
    JSON.stringify({
      model: "fake-small",
      max_tokens: MAX_TOKENS,
      messages: [{ role: "user", content: PROMPT }],
      ...extra,
    }),
  through: (extra: Record<string, unknown> = {}) =>
    JSON.stringify({
      model: "tollgate-mini",
      max_tokens: MAX_TOKENS,
      messages: [{ role: "user", content: PROMPT }],
      ...extra,
    }),
  paid: () => ({
    plan: "Starter",
    model_optimization: true,
    max_tokens: MAX_TOKENS,
    messages: [{ role: "user", content: PROMPT }],
  }),
};

const progress = (msg: string) => process.stderr.write(`  ${msg}\n`);

export interface Measured {
  reqPerSec: number;
  latency: Summary;
  non2xx: number;
  errors: number;
  statusCodes: Record<string, number>;
}

/** One autocannon load point; latencies come from its per-response times (sub-millisecond). */
export async function cannon(
  url: string,
  body: string,
  headers: Record<string, string>,
  connections: number,
  seconds: number,
  stopAfter = Number.POSITIVE_INFINITY,
): Promise<Measured> {
  const latencies: number[] = [];
  const statusCodes: Record<string, number> = {};
  let ok = 0;
  let non2xx = 0;
  const instance = autocannon({
    url,
    method: "POST",
    body,
    headers: { "content-type": "application/json", ...headers },
    connections,
    duration: seconds,
    timeout: 10,
  });
  instance.on("response", (_client: unknown, status: number, _bytes: number, ms: number) => {
    statusCodes[status] = (statusCodes[status] ?? 0) + 1;
    if (status >= 200 && status < 300) {
      ok++;
      latencies.push(ms);
    } else non2xx++;
    if (ok + non2xx === stopAfter) instance.stop();
  });
  const result = await instance;
  return {
    reqPerSec: ok / result.duration,
    latency: summarize(latencies),
    non2xx,
    errors: result.errors + result.timeouts,
    statusCodes,
  };
}

function row(
  mode: string,
  scenario: string,
  side: Row["side"],
  conns: number,
  m: Measured,
  baseline?: { name: string; latency: Summary },
): Row {
  return {
    mode,
    scenario,
    side,
    conns,
    reqPerSec: Number.isNaN(m.reqPerSec) ? null : round(m.reqPerSec),
    p50: round(m.latency.p50),
    p99: round(m.latency.p99),
    mean: round(m.latency.mean),
    count: m.latency.count,
    non2xx: m.non2xx,
    errors: m.errors,
    overheadP50: baseline ? round(m.latency.p50 - baseline.latency.p50) : null,
    overheadP99: baseline ? round(m.latency.p99 - baseline.latency.p99) : null,
    vs: baseline?.name ?? null,
    statusCodes: m.statusCodes,
  };
}

/** One request each way, so a broken setup fails before minutes of load; returns what it saw. */
export async function sanityCheck(t: Target): Promise<Record<string, string>> {
  const direct = await send(`${t.upstreamUrl}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: bodies.direct(),
  });
  if (direct.status !== 200) throw new Error(`direct request answered ${direct.status}: ${direct.body}`);
  const req = throughRequest(t);
  const through = await send(req.url, {
    method: "POST",
    headers: { "content-type": "application/json", ...req.headers },
    body: req.body(),
  });
  if (through.status !== 200) throw new Error(`gateway answered ${through.status}: ${through.body}`);
  const stream = await streamOnce(
    req.url,
    { "content-type": "application/json", ...req.headers },
    req.body({ stream: true }),
  );
  if (stream.status !== 200 || !stream.done || stream.contentChunks === 0)
    throw new Error(
      `a stream through the gateway answered ${stream.status} with ${stream.contentChunks} chunks`,
    );
  if (t.peerHeaders) return { status: String(through.status), stream: `${stream.contentChunks} chunks` };
  const h = through.headers;
  const seen = {
    "x-tollgate-cost": String(h["x-tollgate-cost"] ?? "(none)"),
    "ratelimit-limit": String(h["ratelimit-limit"] ?? "(none)"),
    "ratelimit-remaining": String(h["ratelimit-remaining"] ?? "(none)"),
  };
  if (seen["ratelimit-limit"] === "(none)") throw new Error("the bench key's rate limit is not applied");
  return seen;
}

/** Account door, buffered chat: direct then through at each connection count. */
export async function buffered(t: Target, s: Settings, probe?: CpuProbe): Promise<Row[]> {
  const rows: Row[] = [];
  const directUrl = `${t.upstreamUrl}/chat/completions`;
  const req = throughRequest(t);
  const throughBody = req.body();
  // The gateway's JIT and connection pools warm up once before the first load point.
  progress("warm-up: 3 s through the gateway at 10 connections");
  await cannon(req.url, throughBody, req.headers, 10, 3);
  for (const c of s.connections) {
    await cannon(directUrl, bodies.direct(), {}, c, s.warmup);
    let done = probe?.(`direct ${c} conn`);
    const d = await cannon(directUrl, bodies.direct(), {}, c, s.duration);
    const idle = done?.();
    await cannon(req.url, throughBody, req.headers, c, s.warmup);
    done = probe?.(`through ${c} conn`);
    const th = await cannon(req.url, throughBody, req.headers, c, s.duration);
    const cpu = done?.();
    rows.push(row("direct", "buffered chat", "direct", c, d));
    const through = row(t.mode, "buffered chat", "through", c, th, { name: "direct", latency: d.latency });
    through.cpuMsPerRequest =
      cpu && th.latency.count > 0 ? round((1000 * cpu.gatewayCpuSeconds) / th.latency.count) : null;
    through.idleCpuMsPerSec =
      idle && idle.seconds > 0 ? round((1000 * idle.gatewayCpuSeconds) / idle.seconds) : null;
    rows.push(through);
    progress(
      `buffered ${c} conn: direct ${Math.round(d.reqPerSec)} req/s p50 ${round(d.latency.p50)} ms; ` +
        `through ${Math.round(th.reqPerSec)} req/s p50 ${round(th.latency.p50)} ms, ` +
        `${through.cpuMsPerRequest ?? "–"} CPU-ms/request` +
        (th.non2xx + th.errors > 0 ? ` (${th.non2xx} non-2xx, ${th.errors} errors)` : ""),
    );
  }
  return rows;
}

export interface StreamMeasured {
  ttfb: Measured;
  ttft: Measured;
  gaps: Measured;
}

export async function streams(
  url: string,
  headers: Record<string, string>,
  body: string,
  seconds: number,
): Promise<StreamMeasured> {
  const ttfbs: number[] = [];
  const ttfts: number[] = [];
  const gaps: number[] = [];
  const statusCodes: Record<string, number> = {};
  let non2xx = 0;
  let errors = 0;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  while (performance.now() < deadline) {
    try {
      const r = await streamOnce(url, { "content-type": "application/json", ...headers }, body);
      statusCodes[r.status] = (statusCodes[r.status] ?? 0) + 1;
      if (r.status < 200 || r.status >= 300) non2xx++;
      else if (!r.done || r.contentChunks === 0) errors++;
      else {
        ttfbs.push(r.ttfbMs);
        ttfts.push(r.ttftMs);
        gaps.push(...r.gaps);
      }
    } catch {
      errors++;
    }
  }
  const elapsed = (performance.now() - started) / 1000;
  return {
    ttfb: { reqPerSec: ttfbs.length / elapsed, latency: summarize(ttfbs), non2xx, errors, statusCodes },
    ttft: { reqPerSec: ttfts.length / elapsed, latency: summarize(ttfts), non2xx, errors, statusCodes },
    gaps: { reqPerSec: Number.NaN, latency: summarize(gaps), non2xx: 0, errors: 0, statusCodes: {} },
  };
}

/**
 * Account door streaming, one stream at a time: time to the first byte of the body, to the first
 * token, and the gap between chunks.
 */
export async function streaming(t: Target, s: Settings): Promise<Row[]> {
  const directUrl = `${t.upstreamUrl}/chat/completions`;
  const req = throughRequest(t);
  const stream = { stream: true };
  await streams(directUrl, {}, bodies.direct(stream), s.warmup);
  const d = await streams(directUrl, {}, bodies.direct(stream), s.duration);
  await streams(req.url, req.headers, req.body(stream), s.warmup);
  const th = await streams(req.url, req.headers, req.body(stream), s.duration);
  progress(
    `stream: TTFB p50 direct ${round(d.ttfb.latency.p50)} ms, through ${round(th.ttfb.latency.p50)} ms; ` +
      `TTFT p50 direct ${round(d.ttft.latency.p50)} ms, through ${round(th.ttft.latency.p50)} ms; ` +
      `chunk gap p50 direct ${round(d.gaps.latency.p50)} ms, through ${round(th.gaps.latency.p50)} ms`,
  );
  return [
    row("direct", "stream: TTFB", "direct", 1, d.ttfb),
    row(t.mode, "stream: TTFB", "through", 1, th.ttfb, { name: "direct", latency: d.ttfb.latency }),
    row("direct", "stream: TTFT", "direct", 1, d.ttft),
    row(t.mode, "stream: TTFT", "through", 1, th.ttft, { name: "direct", latency: d.ttft.latency }),
    row("direct", "stream: chunk gap", "direct", 1, d.gaps),
    row(t.mode, "stream: chunk gap", "through", 1, th.gaps, { name: "direct", latency: d.gaps.latency }),
  ];
}

/**
 * Paid door: PaidSession opens a channel, then sequential paid requests (each: the unpaid 402
 * round trip, then the paid retry carrying the credential) alternate with account-door requests
 * of the same prompt over the same node:http client, two after each paid one: the account figure
 * is the second's, so that no account request it counts overlaps a paid request's Commit, which
 * api-edge sends after the paid answer (docs/performance.md, "The account baseline"). Twice:
 * first reusing one voucher (the target's figure), then with a new, higher voucher signed for
 * every request, as the unmodified mppx session manager pays (its server side recovers each new
 * voucher's signer).
 */
export async function paidDoor(t: Target, s: Settings): Promise<Row[]> {
  const reused = await paidRun(t, s, "reused");
  const fresh = await paidRun(t, s, "new");
  return [
    row(t.mode, "paid door: account request", "account", 1, reused.account),
    row(t.mode, "paid door: paid request (reused voucher)", "paid", 1, reused.paid, {
      name: "account",
      latency: reused.account.latency,
    }),
    row(t.mode, "paid door: 402 + paid request", "paid-total", 1, reused.total, {
      name: "account",
      latency: reused.account.latency,
    }),
    row(t.mode, "paid door: paid request (new voucher each)", "paid", 1, fresh.paid, {
      name: "account",
      latency: fresh.account.latency,
    }),
  ];
}

/** One paid-door run: paid requests whose voucher is `voucher` ("reused": one voucher for all;
 * "new": a new one each), each followed by two account requests, the second timed. */
async function paidRun(
  t: Target,
  s: Settings,
  voucher: "reused" | "new",
): Promise<{ account: Measured; paid: Measured; total: Measured }> {
  // The latest exchange of each leg, set by the fetch PaidSession uses.
  const last: { paid?: Exchange | undefined; unpaid?: Exchange | undefined } = {};
  const forget = () => {
    last.paid = undefined;
    last.unpaid = undefined;
  };
  const session = new PaidSession({
    url: t.gatewayUrl,
    privateKey: DEMO_PAYER_PRIVATE_KEY,
    rpcUrl: t.rpcUrl,
    maxDeposit: 50_000_000n,
    voucherEachRequest: voucher === "new",
    fetch: timedFetch((e) => {
      if (e.paid) last.paid = e;
      else last.unpaid = e;
    }),
  });
  const opened = await session.chat(bodies.paid());
  if (opened.voucher !== "opened") throw new Error(`the first paid request did not open a channel`);
  const accountUrl = `${t.gatewayUrl}/v1/chat/completions`;
  const account = () =>
    send(accountUrl, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${t.key}` },
      body: bodies.through(),
    });
  // What a measured paid request's voucher must have been: reused, or newly signed ("raised").
  const expected = voucher === "reused" ? "reused" : "raised";

  const paidLeg: number[] = [];
  const paidTotal: number[] = [];
  const accountMs: number[] = [];
  const paidCodes: Record<string, number> = {};
  const accountCodes: Record<string, number> = {};
  let paidFailures = 0;
  let accountNon2xx = 0;
  let unexpected = 0;
  const run = async (seconds: number, record: boolean) => {
    const deadline = performance.now() + seconds * 1000;
    // Bounded by time and by count.
    for (let i = 0; i < 5_000 && performance.now() < deadline; i++) {
      forget();
      try {
        const r = await session.chat(bodies.paid());
        const asExpected = r.voucher === expected && r.attempts.length === 1;
        if (record) {
          paidCodes[r.status] = (paidCodes[r.status] ?? 0) + 1;
          if (!asExpected) unexpected++;
          else if (last.paid && last.unpaid) {
            paidLeg.push(last.paid.ms);
            paidTotal.push(last.paid.ms + last.unpaid.ms);
          }
        }
      } catch (err) {
        if (record) {
          paidFailures++;
          const status = (err as { details?: { status?: number } }).details?.status ?? "error";
          paidCodes[status] = (paidCodes[status] ?? 0) + 1;
        }
      }
      // Two account requests: the first runs while the paid request's work after its answer (its
      // Commit) is still going, and is not timed; the second is the figure's baseline.
      for (const timed of [false, true]) {
        const a = await account();
        if (!record) continue;
        accountCodes[a.status] = (accountCodes[a.status] ?? 0) + 1;
        if (a.status !== 200) accountNon2xx++;
        else if (timed) accountMs.push(a.ms);
      }
    }
  };
  await run(s.warmup, false);
  await run(s.duration, true);
  await session.close().catch((err: unknown) => progress(`paid session close failed: ${String(err)}`));

  const acc: Measured = {
    reqPerSec: Number.NaN,
    latency: summarize(accountMs),
    non2xx: accountNon2xx,
    errors: 0,
    statusCodes: accountCodes,
  };
  const paid: Measured = {
    reqPerSec: Number.NaN,
    latency: summarize(paidLeg),
    non2xx: paidFailures,
    errors: unexpected,
    statusCodes: paidCodes,
  };
  const total: Measured = { ...paid, latency: summarize(paidTotal) };
  progress(
    `paid door (${voucher} voucher): paid leg p50 ${round(paid.latency.p50)} ms, 402+paid p50 ${round(total.latency.p50)} ms, ` +
      `account p50 ${round(acc.latency.p50)} ms (${paidLeg.length} paid, ${accountMs.length} account)`,
  );
  return { account: acc, paid, total };
}

/** The gateway process's RSS once a number of requests have been served. */
export interface SoakPoint {
  mode: string;
  /** Requests answered through the gateway in the soak so far (at 50 connections). */
  requests: number;
  /** The count this point aimed at; fewer were sent when the time cap came first. */
  aimedAt: number;
  /** VmRSS (MiB) of the gateway process 1 s after the point's last request: the RSS the user sees. */
  rssMb: number | null;
  /**
   * V8's heap in use (MiB) at the same moment, without forcing a collection (garbage not yet
   * collected included), from the gateway's /metrics; null for a gateway without it (the peer).
   */
  heapUsedMb?: number | null;
  seconds: number;
  non2xx: number;
  errors: number;
}

/**
 * Memory under sustained load: buffered chats at 50 connections until `points[i]` requests
 * have been answered in all, the gateway's RSS taken at each point. Bounded by `capSeconds`.
 */
export async function memorySoak(
  t: Target,
  pid: number,
  points: number[],
  capSeconds: number,
): Promise<SoakPoint[]> {
  const req = throughRequest(t);
  const body = req.body();
  const out: SoakPoint[] = [];
  const started = performance.now();
  let answered = 0;
  for (const aimedAt of points) {
    const left = capSeconds - (performance.now() - started) / 1000;
    let non2xx = 0;
    let errors = 0;
    if (left >= 1 && answered < aimedAt) {
      const m = await cannon(req.url, body, req.headers, 50, Math.floor(left), aimedAt - answered);
      answered += m.latency.count + m.non2xx;
      non2xx = m.non2xx;
      errors = m.errors;
    }
    await sleep(1000);
    const rss = memoryOf(pid)?.rss;
    const heapUsed = t.metricsUrl ? await heapUsedOf(t.metricsUrl) : undefined;
    out.push({
      mode: t.mode,
      requests: answered,
      aimedAt,
      rssMb: rss === undefined ? null : round(rss),
      heapUsedMb: heapUsed === undefined ? null : round(heapUsed),
      seconds: round((performance.now() - started) / 1000),
      non2xx,
      errors,
    });
    progress(
      `memory: ${answered} requests, RSS ${rss === undefined ? "–" : rss.toFixed(1)} MB` +
        (heapUsed === undefined ? "" : `, heap used ${heapUsed.toFixed(1)} MB`),
    );
  }
  return out;
}

/** `tollgate_nodejs_heap_size_used_bytes` of a Prometheus endpoint, in MiB; undefined when unreadable. */
async function heapUsedOf(metricsUrl: string): Promise<number | undefined> {
  const text = await fetch(metricsUrl).then(
    (r) => (r.ok ? r.text() : ""),
    () => "",
  );
  const bytes = /^tollgate_nodejs_heap_size_used_bytes (\S+)$/m.exec(text)?.[1];
  return bytes === undefined ? undefined : Number(bytes) / 2 ** 20;
}
