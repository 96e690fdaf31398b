// Rendering the Helm chart with the pinned helm of deploy/tools/install.sh, for the chart tests
// (networkpolicy.e2e.test.ts, monitoring.e2e.test.ts), and the values Helm merges.

import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { parse, parseAllDocuments } from "yaml";

export const HELM = join(REPO_ROOT, ".tools/bin/helm");
export const CHART = join(REPO_ROOT, "helm/tollgate");
export const PRODUCTION = join(REPO_ROOT, "deploy/values/production.yaml");
export const KUBERNETES_VERSION = (/^KUBERNETES_VERSION=v?(\S+)$/m.exec(
  readFileSync(join(REPO_ROOT, "deploy/tools/versions.env"), "utf8"),
)?.[1] ?? "") as string;

// biome-ignore lint/suspicious/noExplicitAny: rendered Kubernetes objects and values are untyped YAML.
export type K8sObject = Record<string, any>;

/** Builds the pinned tools on a cold machine (minutes, once); a no-op when they are cached. */
export function installTools(): void {
  execFileSync("bash", [join(REPO_ROOT, "deploy/tools/install.sh")], { stdio: "inherit" });
}

/** `helm template` of the chart with these values files, as the objects it renders. */
export function renderChart(...valuesFiles: string[]): K8sObject[] {
  const args = ["template", "tollgate", CHART, "-n", "tollgate", "--kube-version", KUBERNETES_VERSION];
  for (const f of valuesFiles) args.push("-f", f);
  const run = spawnSync(HELM, args, { encoding: "utf8" });
  if (run.status !== 0) throw new Error(`helm template ${args.join(" ")} failed:\n${run.stderr}`);
  return parseAllDocuments(run.stdout)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
}

const isMap = (v: unknown): v is K8sObject => v !== null && typeof v === "object" && !Array.isArray(v);

/** Helm's merge of values: maps merge key by key, anything else replaces; null deletes. */
function merge(base: K8sObject, over: K8sObject): K8sObject {
  const out: K8sObject = { ...base };
  for (const [k, v] of Object.entries(over)) {
    if (v === null) delete out[k];
    else out[k] = isMap(v) && isMap(out[k]) ? merge(out[k], v) : v;
  }
  return out;
}

/** The chart's values.yaml with these values files over it, as Helm computes .Values. */
export function chartValues(...valuesFiles: string[]): K8sObject {
  let values = parse(readFileSync(join(CHART, "values.yaml"), "utf8")) as K8sObject;
  for (const f of valuesFiles) values = merge(values, parse(readFileSync(f, "utf8")) ?? {});
  return values;
}
