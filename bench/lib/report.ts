import type { CpuRow, RssRow } from "./procs.js";
import type { Row } from "./scenarios.js";
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
    ["scenario", "mode", "conns", "req/s", "p50 ms", "p99 ms", "overhead p50/p99 ms", "vs", "non-2xx/err"],
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
    ]),
    new Set([2, 3, 4, 5, 6, 8]),
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

/** Each target of issue 7, judged on the figures of this run. */
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
