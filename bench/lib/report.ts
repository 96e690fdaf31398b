import type { CpuRow, RssRow } from "./procs.js";
import type { Row, SoakPoint } from "./scenarios.js";
import { round } from "./stats.js";

export interface TargetResult {
  target: string;
  mode: string;
  measured: string;
  value: number | null;
  limit: string;
  pass: boolean | null;
}

function table(header: string[], lines: string[][], rightAlign: Set<number>): string {
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => (l[i] ?? "").length)));
  const fmt = (cells: string[]) =>
    `| ${cells.map((c, i) => (rightAlign.has(i) ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join(" | ")} |`;
  const rule = `|${widths.map((w, i) => (rightAlign.has(i) ? `${"-".repeat(w + 1)}:` : "-".repeat(w + 2))).join("|")}|`;
  return [fmt(header), rule, ...lines.map(fmt)].join("\n");
}

const num = (v: number | null | undefined, digits?: number) =>
  v === null || v === undefined || Number.isNaN(v)
    ? "–"
    : digits === undefined
      ? String(round(v))
      : v.toFixed(digits);
const signed = (v: number | null) => (v === null ? "–" : `${v >= 0 ? "+" : ""}${num(v)}`);

export function resultsTable(rows: Row[]): string {
  return table(
    [
      "scenario",
      "mode",
      "conns",
      "req/s",
      "p50 ms",
      "p99 ms",
      "overhead p50/p99 ms",
      "vs",
      "non-2xx/err",
      "CPU-ms/req",
    ],
    rows.map((r) => [
      r.scenario,
      r.mode,
      String(r.conns),
      r.reqPerSec === null ? "–" : num(r.reqPerSec, 0),
      num(r.p50),
      num(r.p99),
      r.overheadP50 === null ? "–" : `${signed(r.overheadP50)} / ${signed(r.overheadP99)}`,
      r.vs ?? "",
      `${r.non2xx}/${r.errors}`,
      num(r.cpuMsPerRequest ?? null, 2),
    ]),
    new Set([2, 3, 4, 5, 6, 8, 9]),
  );
}

export function rssTable(rows: RssRow[]): string {
  return table(
    ["mode", "process", "role", "idle RSS MB", "peak RSS MB (VmHWM)", "peak sampled MB"],
    rows.map((r) => [r.mode, r.process, r.role, num(r.idleMb, 1), num(r.peakMb, 1), num(r.sampledPeakMb, 1)]),
    new Set([3, 4, 5]),
  );
}

/** One table per mode: a row per process, a column per load point, in % of one core. */
export function cpuTables(rows: CpuRow[]): string {
  const out: string[] = [];
  for (const mode of [...new Set(rows.map((r) => r.mode))]) {
    const points = rows.filter((r) => r.mode === mode);
    const names = Object.keys(points[0]?.processes ?? {});
    const lines = [
      ...names.map((n) => [n, ...points.map((p) => num(p.processes[n] ?? null, 0))]),
      ["(everything else on the machine)", ...points.map((p) => num(p.others, 0))],
      ["(machine total, 200 = both cores)", ...points.map((p) => num(p.machine, 0))],
    ];
    out.push(
      `${mode}:`,
      table(["process", ...points.map((p) => p.loadPoint)], lines, new Set(points.map((_, i) => i + 1))),
    );
  }
  return out.join("\n");
}

export function targetsList(targets: TargetResult[]): string {
  return targets
    .map(
      (t) =>
        `${t.pass === null ? (t.value === null ? "N/A " : "INFO") : t.pass ? "PASS" : "FAIL"}  ${t.target} [${t.mode}]: ${t.measured} (target ${t.limit})`,
    )
    .join("\n");
}

/** The figures a gateway is compared on, one mode's worth (null: not measured in this run). */
export interface PeerFigures {
  mode: string;
  addedP50At1: number | null;
  addedP99At1: number | null;
  reqPerSecAt50: number | null;
  directReqPerSecAt50: number | null;
  cpuMsAt1: number | null;
  cpuMsAt50: number | null;
  streamTtfbAdded: number | null;
  streamTtftAdded: number | null;
  chunkGapAdded: number | null;
  paidOverAccount: number | null;
  /** The paid request with a new voucher each (the unmodified mppx client's way), over account. */
  paidNewOverAccount: number | null;
  idleRssMb: number | null;
  /** The gateway's CPU while idle (ms per second), measured during the direct 1-connection point. */
  idleCpuMsPerSec: number | null;
  rssAfter10kMb: number | null;
  rssAfter100kMb: number | null;
  /** V8's heap in use at the same points (garbage included), when the gateway reports it. */
  heapUsedAfter10kMb: number | null;
  heapUsedAfter100kMb: number | null;
}

/** Collects {@link PeerFigures} for each mode from the rows, RSS rows and soak points of a run. */
export function peerFigures(rows: Row[], rss: RssRow[], soak: SoakPoint[], modes: string[]): PeerFigures[] {
  const through = (mode: string, scenario: string, conns = 1) =>
    rows.find((r) => r.mode === mode && r.scenario === scenario && r.side === "through" && r.conns === conns);
  const v = (x: number | null | undefined) => (x === undefined || x === null || Number.isNaN(x) ? null : x);
  return modes.map((mode) => {
    const t1 = through(mode, "buffered chat", 1);
    const t50 = through(mode, "buffered chat", 50);
    const d50 = t50 ? rows[rows.indexOf(t50) - 1] : undefined;
    const main = rss.filter(
      (r) => r.mode === mode && (r.role === "all-in-one" || r.role === "peer" || r.role === "service"),
    );
    const soakAt = (n: number, figure: "rssMb" | "heapUsedMb" = "rssMb") => {
      const p = soak.find((s) => s.mode === mode && s.aimedAt === n);
      return p && p.requests >= n ? (p[figure] ?? null) : null;
    };
    return {
      mode,
      addedP50At1: v(t1?.overheadP50),
      addedP99At1: v(t1?.overheadP99),
      reqPerSecAt50: v(t50?.reqPerSec),
      directReqPerSecAt50: v(d50?.side === "direct" ? d50.reqPerSec : null),
      cpuMsAt1: v(t1?.cpuMsPerRequest),
      cpuMsAt50: v(t50?.cpuMsPerRequest),
      streamTtfbAdded: v(through(mode, "stream: TTFB")?.overheadP50),
      streamTtftAdded: v(through(mode, "stream: TTFT")?.overheadP50),
      chunkGapAdded: v(through(mode, "stream: chunk gap")?.overheadP50),
      paidOverAccount: v(
        rows.find((r) => r.mode === mode && r.scenario === "paid door: paid request (reused voucher)")
          ?.overheadP50,
      ),
      paidNewOverAccount: v(
        rows.find((r) => r.mode === mode && r.scenario === "paid door: paid request (new voucher each)")
          ?.overheadP50,
      ),
      // The stack's: its services' idle RSS summed.
      idleRssMb: main.length > 0 ? round(main.reduce((a, r) => a + r.idleMb, 0)) : null,
      idleCpuMsPerSec: v(t1?.idleCpuMsPerSec),
      rssAfter10kMb: soakAt(10_000),
      rssAfter100kMb: soakAt(100_000),
      heapUsedAfter10kMb: soakAt(10_000, "heapUsedMb"),
      heapUsedAfter100kMb: soakAt(100_000, "heapUsedMb"),
    };
  });
}

/** Every compared figure, a column per mode, Portkey's beside Tollgate's. */
export function peerTable(figures: PeerFigures[]): string {
  const lines: Array<[string, (f: PeerFigures) => string]> = [
    ["added latency p50 at 1 conn (ms)", (f) => signed(f.addedP50At1)],
    ["added latency p99 at 1 conn (ms)", (f) => signed(f.addedP99At1)],
    ["req/s at 50 conns", (f) => num(f.reqPerSecAt50, 0)],
    ["  direct req/s in the same window", (f) => num(f.directReqPerSecAt50, 0)],
    ["CPU-ms per request at 1 conn", (f) => num(f.cpuMsAt1, 2)],
    ["CPU-ms per request at 50 conns", (f) => num(f.cpuMsAt50, 2)],
    ["stream time to first byte added, p50 (ms)", (f) => signed(f.streamTtfbAdded)],
    ["stream time to first token added, p50 (ms)", (f) => signed(f.streamTtftAdded)],
    ["stream chunk gap added, p50 (ms)", (f) => signed(f.chunkGapAdded)],
    ["paid request over account request, p50 (ms)", (f) => signed(f.paidOverAccount)],
    ["  with a new voucher each (mppx's way), p50 (ms)", (f) => signed(f.paidNewOverAccount)],
    ["idle RSS (MB; stack: services summed)", (f) => num(f.idleRssMb, 1)],
    ["CPU while idle (ms per s; stack: every process)", (f) => num(f.idleCpuMsPerSec, 1)],
    ["RSS after 10k requests (MB)", (f) => num(f.rssAfter10kMb, 1)],
    ["RSS after 100k requests (MB)", (f) => num(f.rssAfter100kMb, 1)],
    [
      "  heap used after 10k → 100k (MB)",
      (f) => `${num(f.heapUsedAfter10kMb, 1)} → ${num(f.heapUsedAfter100kMb, 1)}`,
    ],
  ];
  return table(
    ["figure", ...figures.map((f) => f.mode)],
    lines.map(([name, cell]) => [name, ...figures.map(cell)]),
    new Set(figures.map((_, i) => i + 1)),
  );
}

/**
 * The targets against the peer, judged on this run's figures: PASS/FAIL, or N/A when a figure
 * was not measured (a mode left out, or the memory soak without BENCH_LONG=1).
 */
export function evaluatePeerTargets(figures: PeerFigures[]): TargetResult[] {
  const out: TargetResult[] = [];
  const of = (mode: string) => figures.find((f) => f.mode === mode);
  const peer = of("portkey");
  const ms = (x: number) => `${signed(round(x))} ms`;
  const check = (
    mode: string,
    target: string,
    value: number | null | undefined,
    limit: number | null | undefined,
    limitText: (limit: number) => string,
    describe: (value: number, limit: number) => string,
    atLeast = false,
  ) => {
    const ok = value !== null && value !== undefined && limit !== null && limit !== undefined;
    out.push({
      target,
      mode,
      value: ok ? round(value) : null,
      measured: ok ? describe(value, limit) : "not measured",
      limit: ok ? limitText(limit) : "–",
      pass: ok ? (atLeast ? value >= limit : value <= limit) : null,
    });
  };
  const stack = of("stack");
  if (stack) {
    const cpu = (conns: 1 | 50, limit: number) =>
      check(
        "stack",
        `CPU-ms per request at ${conns} conn${conns > 1 ? "s" : ""} (every process, NATS and Redis too)`,
        conns === 1 ? stack.cpuMsAt1 : stack.cpuMsAt50,
        limit,
        (l) => `≤ ${l} ms`,
        (v) => `${v.toFixed(2)} ms (Portkey ${num(conns === 1 ? peer?.cpuMsAt1 : peer?.cpuMsAt50, 2)})`,
      );
    cpu(50, 1.0);
    cpu(1, 1.5);
    check(
      "stack",
      "req/s at 50 conns, ≥ 1.0× Portkey",
      stack.reqPerSecAt50,
      peer?.reqPerSecAt50,
      (l) => `≥ ${num(l, 0)} req/s`,
      (v, l) => `${num(v, 0)} req/s = ${(v / l).toFixed(2)}× Portkey's ${num(l, 0)}`,
      true,
    );
    check(
      "stack",
      "added p50 at 1 conn, ≤ Portkey + 0.5 ms",
      stack.addedP50At1,
      peer?.addedP50At1 === null || peer?.addedP50At1 === undefined ? null : peer.addedP50At1 + 0.5,
      (l) => `≤ ${ms(l)}`,
      (v) => `${ms(v)} (Portkey ${ms(peer?.addedP50At1 ?? Number.NaN)})`,
    );
    check(
      "stack",
      "stream time to first byte added, p50",
      stack.streamTtfbAdded,
      1.5,
      (l) => `≤ ${ms(l)}`,
      (v) => `${ms(v)} (Portkey ${ms(peer?.streamTtfbAdded ?? Number.NaN)})`,
    );
    check(
      "stack",
      "paid request over an account request, p50",
      stack.paidOverAccount,
      0.6,
      (l) => `≤ ${ms(l)}`,
      (v) => ms(v),
    );
  }
  const aio = of("all-in-one");
  if (aio) {
    check(
      "all-in-one",
      "added p50 at 1 conn, ≤ Portkey's",
      aio.addedP50At1,
      peer?.addedP50At1,
      (l) => `≤ ${ms(l)}`,
      (v, l) => `${ms(v)} (Portkey ${ms(l)})`,
    );
    check(
      "all-in-one",
      "req/s at 50 conns, ≥ 1.2× Portkey",
      aio.reqPerSecAt50,
      peer?.reqPerSecAt50 === null || peer?.reqPerSecAt50 === undefined ? null : 1.2 * peer.reqPerSecAt50,
      (l) => `≥ ${num(l, 0)} req/s`,
      (v, l) => `${num(v, 0)} req/s = ${((1.2 * v) / l).toFixed(2)}× Portkey's ${num(l / 1.2, 0)}`,
      true,
    );
    for (const conns of [1, 50] as const)
      check(
        "all-in-one",
        `CPU-ms per request at ${conns} conn${conns > 1 ? "s" : ""}, ≤ Portkey's`,
        conns === 1 ? aio.cpuMsAt1 : aio.cpuMsAt50,
        conns === 1 ? peer?.cpuMsAt1 : peer?.cpuMsAt50,
        (l) => `≤ ${l.toFixed(2)} ms`,
        (v, l) => `${v.toFixed(2)} ms (Portkey ${l.toFixed(2)})`,
      );
    check(
      "all-in-one",
      "RSS after 100k requests ≤ 1.2× RSS after 10k (BENCH_LONG=1)",
      aio.rssAfter100kMb,
      aio.rssAfter10kMb === null ? null : 1.2 * aio.rssAfter10kMb,
      (l) => `≤ ${l.toFixed(1)} MB`,
      (v, l) =>
        `${v.toFixed(1)} MB after 100k, ${(l / 1.2).toFixed(1)} MB after 10k (Portkey ${num(peer?.rssAfter10kMb, 1)} → ${num(peer?.rssAfter100kMb, 1)})`,
    );
  }
  for (const f of figures.filter((x) => x.mode !== "portkey"))
    out.push({
      target: "added p99 at 1 conn, beside Portkey's",
      mode: f.mode,
      value: f.addedP99At1,
      measured: `${signed(f.addedP99At1)} ms (Portkey ${signed(peer?.addedP99At1 ?? null)} ms)`,
      limit: "info",
      pass: null,
    });
  return out;
}

/** Each absolute target (bench/README.md), judged on the figures of this run. */
export function evaluateTargets(rows: Row[], rss: RssRow[], modes: string[]): TargetResult[] {
  const out: TargetResult[] = [];
  const find = (mode: string, scenario: string, side: Row["side"], conns = 1) => {
    // Direct rows carry mode "direct"; they are the ones just before their mode's through row.
    const i = rows.findIndex(
      (r) => r.mode === mode && r.scenario === scenario && r.side === side && r.conns === conns,
    );
    return i === -1 ? undefined : rows[i];
  };
  const directBefore = (through: Row | undefined) => {
    if (!through) return undefined;
    const i = rows.indexOf(through);
    return rows[i - 1]?.side === "direct" ? rows[i - 1] : undefined;
  };
  const judge = (
    target: string,
    mode: string,
    value: number | null | undefined,
    limit: number,
    unit: string,
    atLeast = false,
    describe?: (v: number) => string,
  ) => {
    const ok = value !== null && value !== undefined && !Number.isNaN(value);
    out.push({
      target,
      mode,
      value: ok ? round(value) : null,
      measured: ok ? (describe ? describe(value) : `${signed(round(value))} ${unit}`) : "not measured",
      limit: `${atLeast ? "≥" : "≤"} ${limit} ${unit}`,
      pass: ok ? (atLeast ? value >= limit : value <= limit) : null,
    });
  };

  const stack1 = find("stack", "buffered chat", "through", 1);
  judge("added latency at 1 connection, account door, p50", "stack", stack1?.overheadP50, 1.0, "ms");
  judge("added latency at 1 connection, account door, p99", "stack", stack1?.overheadP99, 3, "ms");
  for (const mode of modes) {
    const t50 = find(mode, "buffered chat", "through", 50);
    const d50 = directBefore(t50);
    const ratio = t50?.reqPerSec && d50?.reqPerSec ? (100 * t50.reqPerSec) / d50.reqPerSec : null;
    judge(
      mode === "stack"
        ? "throughput at 50 connections, % of direct"
        : "throughput at 50 connections, % of direct (info: the target names the stack)",
      mode,
      ratio,
      15,
      "%",
      true,
      (v) =>
        `${num(t50?.reqPerSec ?? null, 0)} of ${num(d50?.reqPerSec ?? null, 0)} req/s = ${v.toFixed(1)} %`,
    );
  }
  for (const mode of modes) {
    judge(
      "stream time to first token over direct, p50",
      mode,
      find(mode, "stream: TTFT", "through")?.overheadP50,
      1,
      "ms",
    );
    judge(
      "stream per-chunk delay over direct, p50",
      mode,
      find(mode, "stream: chunk gap", "through")?.overheadP50,
      0.1,
      "ms",
    );
    judge(
      "paid request with a reused voucher over an account request, p50",
      mode,
      find(mode, "paid door: paid request (reused voucher)", "paid")?.overheadP50,
      1,
      "ms",
    );
  }
  const services = rss.filter((r) => r.role === "service");
  if (services.length > 0) {
    const worst = services.reduce((a, b) => (b.idleMb > a.idleMb ? b : a));
    judge(
      "idle RSS per service (largest)",
      "stack",
      worst.idleMb,
      120,
      "MB",
      false,
      (v) =>
        `${worst.process} ${v.toFixed(1)} MB; ${services.map((s) => `${s.process} ${s.idleMb.toFixed(0)}`).join(", ")}`,
    );
  }
  for (const aio of rss.filter((r) => r.role === "all-in-one")) {
    out.push({
      target: "idle RSS of the all-in-one process (info: five services in one process)",
      mode: "all-in-one",
      value: round(aio.idleMb),
      measured: `${aio.idleMb.toFixed(1)} MB`,
      limit: "≤ 120 MB per service",
      pass: null,
    });
  }
  return out;
}
