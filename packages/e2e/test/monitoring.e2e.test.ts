// The chart's monitoring objects (helm/tollgate/templates/podmonitors.yaml, prometheusrule.yaml,
// dashboard.yaml), rendered for the production and CI examples: a PodMonitor per service, every
// alert of helm/tollgate/alerts/tollgate.yaml with a severity and a runbook_url whose section
// exists in docs/runbooks, and the dashboard ConfigMap for Grafana's sidecar. The metric names
// they query are checked against a live scrape in metrics.e2e.test.ts; the objects' shape against
// the Prometheus Operator's CRD schemas and promtool by `make helm-lint`.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { beforeAll, describe, expect, it } from "vitest";
import { CHART, chartValues, installTools, type K8sObject, PRODUCTION, renderChart } from "./chart.js";

const EVERYTHING = join(CHART, "ci/everything-values.yaml");

/** GitHub's anchor of a Markdown heading. */
const slug = (heading: string) =>
  heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, "")
    .replace(/ /g, "-");

function anchorsOf(file: string): Set<string> {
  const text = readFileSync(join(REPO_ROOT, file), "utf8");
  return new Set([...text.matchAll(/^#{1,6} (.+)$/gm)].map((m) => slug(m[1]!)));
}

const rulesOf = (objects: K8sObject[]) =>
  objects
    .filter((o) => o.kind === "PrometheusRule")
    .flatMap((o) =>
      o.spec.groups.flatMap((g: K8sObject) => g.rules.map((r: K8sObject) => ({ group: g.name, ...r }))),
    );

beforeAll(() => installTools(), 900_000);

describe("the production example's monitoring objects", () => {
  let objects: K8sObject[];
  let values: K8sObject;
  beforeAll(() => {
    objects = renderChart(PRODUCTION);
    values = chartValues(PRODUCTION);
  });

  it("has a PodMonitor per service scraping its metrics port, the job named after the service", () => {
    const monitors = objects.filter((o) => o.kind === "PodMonitor");
    const services = Object.keys(values.components).filter((c) => values.components[c].enabled);
    expect(monitors.map((m) => m.spec.selector.matchLabels["app.kubernetes.io/component"]).sort()).toEqual(
      services.sort(),
    );
    for (const m of monitors) {
      expect(m.metadata.labels.release).toBe("kube-prometheus-stack");
      expect(m.spec.jobLabel).toBe("app.kubernetes.io/component");
      expect(m.spec.namespaceSelector).toEqual({ matchNames: ["tollgate"] });
      expect(m.spec.podMetricsEndpoints).toEqual([
        { port: "metrics", path: "/metrics", scheme: "http", interval: "30s", scrapeTimeout: "10s" },
      ]);
    }
  });

  it("alerts on what the runbooks describe, each with a severity and a runbook_url to its section", () => {
    const rules = rulesOf(objects);
    const names = rules.map((r) => r.alert);
    expect(new Set(names).size).toBe(names.length);
    for (const required of [
      "TollgateBudgetHoldsExpiring",
      "TollgateUsageConsumerLag",
      "TollgateUsagePublishFailures",
      "TollgateUpstreamCooledDown",
      "TollgateHigh5xxRate",
      "TollgateSettlementStalled",
      "TollgatePaidCommitFailed",
      "TollgateChainRpcErrors",
      "TollgateUsageOverQuote",
    ])
      expect(names).toContain(required);
    const base = "https://github.com/your-org/tollgate/blob/main/";
    for (const r of rules) {
      expect(["page", "ticket"], r.alert).toContain(r.labels.severity);
      expect(r.annotations.summary, r.alert).toBeTruthy();
      const url: string = r.annotations.runbook_url;
      expect(url.startsWith(base), url).toBe(true);
      const [file, anchor] = url.slice(base.length).split("#") as [string, string];
      expect(file, r.alert).toBe(`docs/runbooks/${r.group.replace(/^tollgate-/, "")}.md`);
      expect(anchorsOf(file).has(anchor), `${url}: no such heading`).toBe(true);
    }
  });

  it("documents no alert the chart does not ship", () => {
    const names = new Set(rulesOf(objects).map((r) => r.alert));
    for (const s of Object.keys(values.components)) {
      const headings = [
        ...readFileSync(join(REPO_ROOT, "docs/runbooks", `${s}.md`), "utf8").matchAll(
          /^### (Tollgate\w+)$/gm,
        ),
      ].map((m) => m[1]!);
      expect(headings.length, s).toBeGreaterThan(0);
      for (const h of headings) expect(names.has(h), `docs/runbooks/${s}.md: ${h}`).toBe(true);
    }
  });

  it("ships the dashboard in a ConfigMap Grafana's sidecar picks up", () => {
    const cm = objects.find((o) => o.kind === "ConfigMap" && o.data?.["tollgate.json"] !== undefined);
    expect(cm?.metadata.labels.grafana_dashboard).toBe("1");
    expect(cm?.metadata.annotations).toEqual({ grafana_folder: "Tollgate" });
    const file = JSON.parse(readFileSync(join(CHART, "dashboards/tollgate.json"), "utf8"));
    expect(JSON.parse(cm?.data["tollgate.json"])).toEqual(file);
    const titles = JSON.stringify(file.panels.map((p: K8sObject) => p.title)).toLowerCase();
    for (const topic of ["requests", "latency", "overhead", "tokens", "cost", "budget", "payment", "lag"])
      expect(titles, topic).toContain(topic);
  });
});

describe("options", () => {
  it("links runbooks by repository path without a base URL, and adds the extra alert labels", () => {
    const rules = rulesOf(renderChart(EVERYTHING));
    expect(rules.length).toBeGreaterThan(0);
    for (const r of rules) {
      expect(r.annotations.runbook_url).toMatch(/^docs\/runbooks\/[a-z-]+\.md#tollgate[a-z0-9]+$/);
      expect(r.labels.team).toBe("gateway");
    }
  });

  it("renders none of them by default", () => {
    const kinds = renderChart(join(CHART, "ci/minimal-values.yaml")).map((o) => o.kind);
    for (const k of ["PodMonitor", "PrometheusRule", "NetworkPolicy"]) expect(kinds).not.toContain(k);
  });
});
