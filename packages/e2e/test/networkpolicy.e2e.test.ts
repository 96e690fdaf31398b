// NetworkPolicies of the chart (helm/tollgate/templates/networkpolicies.yaml): rendered for the
// production example, every policy is flattened into the traffic it allows (who, which
// direction, which peer, which port), and that set must equal what values.yaml describes: one
// ingress and one egress grant per edge of `components.*.connects`, plus the documented extras
// (public ingress, metrics scraping, DNS, NATS, Redis, the named egress entries). Nothing else.

import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chartValues, installTools, type K8sObject, PRODUCTION, renderChart } from "./chart.js";

const RELEASE_LABELS = { "app.kubernetes.io/name": "tollgate", "app.kubernetes.io/instance": "tollgate" };

/** The labels of a component's pods. */
const podLabels = (component: string): Record<string, string> => ({
  ...RELEASE_LABELS,
  "app.kubernetes.io/component": component,
});

function matches(selector: K8sObject | undefined, labels: Record<string, string>): boolean {
  for (const [k, v] of Object.entries(selector?.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of selector?.matchExpressions ?? []) {
    const has = e.key in labels;
    const value = labels[e.key];
    const ok =
      e.operator === "In"
        ? has && e.values.includes(value)
        : e.operator === "NotIn"
          ? !has || !e.values.includes(value)
          : e.operator === "Exists"
            ? has
            : !has;
    if (!ok) return false;
  }
  return true;
}

/** A stable text of a peer outside the release (a selector of another namespace, an ipBlock). */
const external = (peer: K8sObject) => `ext:${JSON.stringify(peer, Object.keys(flatKeys(peer)).sort())}`;
function flatKeys(o: unknown, acc: Record<string, true> = {}): Record<string, true> {
  if (o && typeof o === "object")
    for (const [k, v] of Object.entries(o)) {
      acc[k] = true;
      flatKeys(v, acc);
    }
  return acc;
}

/**
 * What one policy allows, one string per (selected component, direction, peer, port). A peer with
 * only a podSelector is in the release's namespace: it resolves to the components it selects.
 */
function grants(policy: K8sObject, components: string[]): string[] {
  const out: string[] = [];
  const selected = components.filter((c) => matches(policy.spec.podSelector, podLabels(c)));
  const peersOf = (peers: K8sObject[] | undefined): string[] => {
    if (!peers || peers.length === 0) return ["any"];
    return peers.flatMap((p) =>
      p.podSelector && !p.namespaceSelector && !p.ipBlock
        ? components.filter((c) => matches(p.podSelector, podLabels(c))).map((c) => `pod:${c}`)
        : [external(p)],
    );
  };
  const portsOf = (ports: K8sObject[] | undefined) =>
    (ports ?? [{ port: "all" }]).map((p) => `${p.port}/${p.protocol ?? "TCP"}`);
  for (const c of selected) {
    for (const rule of policy.spec.ingress ?? [])
      for (const peer of peersOf(rule.from))
        for (const port of portsOf(rule.ports)) out.push(`in ${c} <- ${peer} ${port}`);
    for (const rule of policy.spec.egress ?? [])
      for (const peer of peersOf(rule.to))
        for (const port of portsOf(rule.ports)) out.push(`out ${c} -> ${peer} ${port}`);
  }
  return out;
}

interface Edge {
  from: string;
  to: string;
  port: number;
}

/** The edges of the components description: each connects entry to an enabled component. */
function edgesOf(values: K8sObject): Edge[] {
  const edges = new Map<string, Edge>();
  for (const [name, c] of Object.entries<K8sObject>(values.components)) {
    if (!c.enabled) continue;
    for (const to of Object.values<K8sObject>(c.connects ?? {})) {
      const target = values.components[to.component];
      if (!target?.enabled) continue;
      const port = target.ports.find((p: K8sObject) => p.name === (to.port ?? "grpc")).port;
      edges.set(`${name}>${to.component}:${port}`, { from: name, to: to.component, port });
    }
  }
  return [...edges.values()];
}

/** Everything values.yaml says may flow: the edges, then the documented extras. */
function expectedGrants(values: K8sObject): string[] {
  const np = values.networkPolicy;
  const enabled = Object.keys(values.components).filter((c) => values.components[c].enabled);
  const peers = (list: K8sObject[] | undefined) => (list?.length ? list.map(external) : ["any"]);
  const out: string[] = [];
  for (const e of edgesOf(values)) {
    out.push(`in ${e.to} <- pod:${e.from} ${e.port}/TCP`, `out ${e.from} -> pod:${e.to} ${e.port}/TCP`);
  }
  for (const p of np.publicIngress) {
    const port = values.components[p.component].ports.find((x: K8sObject) => x.name === p.port).port;
    for (const peer of peers(p.from)) out.push(`in ${p.component} <- ${peer} ${port}/TCP`);
  }
  const scraper: K8sObject = { namespaceSelector: np.metrics.namespaceSelector };
  if (Object.keys(np.metrics.podSelector ?? {}).length > 0) scraper.podSelector = np.metrics.podSelector;
  for (const c of enabled) {
    const metrics = values.components[c].ports.find((p: K8sObject) => p.name === "metrics");
    if (metrics) out.push(`in ${c} <- ${external(scraper)} ${metrics.port}/TCP`);
    for (const peer of peers(np.dns.to))
      for (const port of np.dns.ports)
        out.push(`out ${c} -> ${peer} ${port}/UDP`, `out ${c} -> ${peer} ${port}/TCP`);
    for (const dep of ["nats", "redis"])
      if (values.components[c][dep])
        for (const peer of peers(np[dep].to))
          for (const port of np[dep].ports) out.push(`out ${c} -> ${peer} ${port}/TCP`);
  }
  for (const rule of Object.values<K8sObject>(np.egress))
    for (const c of rule.components.filter((x: string) => enabled.includes(x)))
      for (const peer of peers(rule.to))
        for (const port of rule.ports) out.push(`out ${c} -> ${peer} ${port}/TCP`);
  return out;
}

let work: string;
beforeAll(() => {
  installTools();
  work = mkdtempSync(join(tmpdir(), "tollgate-np-"));
}, 900_000);
afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

function check(valuesFiles: string[]) {
  const values = chartValues(...valuesFiles);
  const components = Object.keys(values.components).filter((c) => values.components[c].enabled);
  const policies = renderChart(...valuesFiles).filter((o) => o.kind === "NetworkPolicy");
  return { values, components, policies };
}

describe("NetworkPolicies of the production example", () => {
  let values: K8sObject;
  let components: string[];
  let policies: K8sObject[];
  beforeAll(() => {
    ({ values, components, policies } = check([PRODUCTION]));
  });

  it("turns them on, with a default deny of ingress and egress for every pod of the release", () => {
    expect(values.networkPolicy.enabled).toBe(true);
    const deny = policies.filter((p) => !p.spec.ingress && !p.spec.egress);
    expect(deny).toHaveLength(1);
    expect([...deny[0]!.spec.policyTypes].sort()).toEqual(["Egress", "Ingress"]);
    for (const c of components) expect(matches(deny[0]!.spec.podSelector, podLabels(c)), c).toBe(true);
    // Nothing outside the release is selected: another chart's pods in the namespace are left alone.
    expect(matches(deny[0]!.spec.podSelector, { "app.kubernetes.io/component": "api-edge" })).toBe(false);
  });

  it("derives the edges the runbooks draw (docs/runbooks/README.md) from components.*.connects", () => {
    expect(
      edgesOf(values)
        .map((e) => `${e.from} -> ${e.to}:${e.port}`)
        .sort(),
    ).toEqual([
      "api-edge -> auth-policy:50051",
      "api-edge -> inference-router:50053",
      "api-edge -> metering:50054",
      "api-edge -> mpp-payment:50052",
      "metering -> auth-policy:50051",
      "metering -> mpp-payment:50052",
    ]);
  });

  it("has one ingress policy on the callee and one egress policy on the caller per edge, each allowing that edge only", () => {
    const byGrants = policies.map((p) => grants(p, components).sort().join("\n"));
    for (const e of edgesOf(values)) {
      const inbound = `in ${e.to} <- pod:${e.from} ${e.port}/TCP`;
      const outbound = `out ${e.from} -> pod:${e.to} ${e.port}/TCP`;
      expect(
        byGrants.filter((g) => g === inbound),
        inbound,
      ).toHaveLength(1);
      expect(
        byGrants.filter((g) => g === outbound),
        outbound,
      ).toHaveLength(1);
    }
    // Every policy states the directions it governs, and only those.
    for (const p of policies.filter((x) => x.spec.ingress || x.spec.egress)) {
      const types = [p.spec.ingress ? "Ingress" : "", p.spec.egress ? "Egress" : ""].filter(Boolean);
      expect(p.spec.policyTypes, p.metadata.name).toEqual(types);
    }
  });

  it("opens exactly the edges and the documented extras, nothing else", () => {
    const actual = policies.flatMap((p) => grants(p, components));
    expect([...new Set(actual)].sort()).toEqual([...new Set(expectedGrants(values))].sort());
    // No rule without a port or a peer: the production example names every outside peer.
    expect(actual.filter((g) => g.includes(" any ") || g.endsWith(" all/TCP"))).toEqual([]);
  });
});

describe("the policies follow the components description", () => {
  it("adds the edge when a component gains a connects entry, and drops a disabled component's", () => {
    const extra = join(work, "extra.yaml");
    writeFileSync(
      extra,
      [
        "components:",
        "  inference-router:",
        "    connects:",
        "      METERING_ADDR: { component: metering }",
        "  mpp-payment:",
        "    enabled: false",
        "",
      ].join("\n"),
    );
    const { values, components, policies } = check([PRODUCTION, extra]);
    const actual = [...new Set(policies.flatMap((p) => grants(p, components)))].sort();
    expect(actual).toContain("out inference-router -> pod:metering 50054/TCP");
    expect(actual).toContain("in metering <- pod:inference-router 50054/TCP");
    expect(actual.filter((g) => g.includes("mpp-payment"))).toEqual([]);
    expect(actual).toEqual([...new Set(expectedGrants(values))].sort());
  });

  it("refuses an edge to a port the callee's Service does not expose", () => {
    const bad = join(work, "bad.yaml");
    writeFileSync(bad, "components:\n  auth-policy:\n    service:\n      ports: [metrics]\n");
    expect(() => renderChart(PRODUCTION, bad)).toThrow(/components.auth-policy.service.ports lacks "grpc"/);
  });
});
