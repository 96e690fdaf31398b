// The tollgate_* metric names the chart's alerts (helm/tollgate/alerts/tollgate.yaml) and
// dashboard (helm/tollgate/dashboards/tollgate.json) query, and the names a scrape exports, so
// that metrics.e2e.test.ts can check every query against the running services.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { parse } from "yaml";

/** One PromQL expression and where it comes from. */
export interface Query {
  where: string;
  expr: string;
}

/** Every alert expression and every dashboard target of the chart. */
export function chartQueries(): Query[] {
  const queries: Query[] = [];
  const alerts = parse(readFileSync(join(REPO_ROOT, "helm/tollgate/alerts/tollgate.yaml"), "utf8")) as {
    groups: Record<string, { alert: string; expr: string }[]>;
  };
  for (const [group, rules] of Object.entries(alerts.groups))
    for (const r of rules) queries.push({ where: `alert ${group}/${r.alert}`, expr: r.expr });
  type Panel = { title?: string; targets?: { expr?: string }[]; panels?: Panel[] };
  const dashboard = JSON.parse(
    readFileSync(join(REPO_ROOT, "helm/tollgate/dashboards/tollgate.json"), "utf8"),
  ) as { panels: Panel[]; templating?: { list: { name: string; definition?: string }[] } };
  const walk = (panels: Panel[]) => {
    for (const p of panels) {
      for (const t of p.targets ?? []) if (t.expr) queries.push({ where: `panel ${p.title}`, expr: t.expr });
      walk(p.panels ?? []);
    }
  };
  walk(dashboard.panels);
  for (const v of dashboard.templating?.list ?? [])
    if (v.definition) queries.push({ where: `variable ${v.name}`, expr: v.definition });
  return queries;
}

/** The tollgate_* metric names an expression selects (quoted label values are not names). */
export function metricNames(expr: string): string[] {
  const unquoted = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  return [...new Set(unquoted.match(/\btollgate_[a-zA-Z0-9_]+/g) ?? [])].sort();
}

/**
 * The series names an exposition text offers: every `# TYPE` name, with `_bucket`, `_sum` and
 * `_count` for histograms (`_sum`, `_count` for summaries), so that a metric registered but not
 * yet observed counts too.
 */
export function exportedNames(exposition: string): Set<string> {
  const names = new Set<string>();
  for (const [, name, type] of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    names.add(name!);
    if (type === "histogram") for (const s of ["_bucket", "_sum", "_count"]) names.add(`${name}${s}`);
    if (type === "summary") for (const s of ["_sum", "_count"]) names.add(`${name}${s}`);
  }
  return names;
}

/** "where: name" for every name a query uses that `exported` lacks. */
export function unknownNames(queries: Query[], exported: Set<string>): string[] {
  return queries.flatMap((q) =>
    metricNames(q.expr)
      .filter((n) => !exported.has(n))
      .map((n) => `${q.where}: ${n}`),
  );
}
