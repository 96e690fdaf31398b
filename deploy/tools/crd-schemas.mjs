#!/usr/bin/env node
// Turns CustomResourceDefinitions (JSON, as the Prometheus Operator's Go module ships them in
// jsonnet/prometheus-operator/*-crd.json) into JSON schemas kubeconform reads offline, one per
// served version: <out>/<group>/<kind>_<version>.json (monitoring.coreos.com/podmonitor_v1.json),
// the layout of kubeconform's -schema-location '<out>/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'.
//
// Strict like k8s-schemas.mjs: every object with declared properties refuses unknown ones (unless
// the CRD keeps unknown fields), descriptions are dropped, int-or-string fields take either.
//
// Usage: node deploy/tools/crd-schemas.mjs <out-dir> <crd.json>...
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [outDir, ...crds] = process.argv.slice(2);
if (!outDir || crds.length === 0) {
  console.error("usage: crd-schemas.mjs <out-dir> <crd.json>...");
  process.exit(2);
}

function strict(node) {
  if (Array.isArray(node)) return node.map(strict);
  if (node === null || typeof node !== "object") return node;
  if (node["x-kubernetes-int-or-string"]) return { oneOf: [{ type: "string" }, { type: "integer" }] };
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === "description" || k.startsWith("x-kubernetes-")) continue;
    // "properties" maps names to schemas: walk its values, never treat a name as a keyword.
    out[k] =
      k === "properties" ? Object.fromEntries(Object.entries(v).map(([p, s]) => [p, strict(s)])) : strict(v);
  }
  if (
    out.properties &&
    out.additionalProperties === undefined &&
    !node["x-kubernetes-preserve-unknown-fields"]
  )
    out.additionalProperties = false;
  return out;
}

let files = 0;
for (const path of crds) {
  const crd = JSON.parse(readFileSync(path, "utf8"));
  if (crd.kind !== "CustomResourceDefinition") throw new Error(`${path}: not a CustomResourceDefinition`);
  const { group, names } = crd.spec;
  for (const version of crd.spec.versions) {
    if (!version.served) continue;
    const schema = strict(version.schema.openAPIV3Schema);
    schema.properties.kind = { type: "string", enum: [names.kind] };
    schema.properties.apiVersion = { type: "string", enum: [`${group}/${version.name}`] };
    schema.properties.metadata = { type: "object" };
    mkdirSync(join(outDir, group), { recursive: true });
    writeFileSync(
      join(outDir, group, `${names.kind.toLowerCase()}_${version.name}.json`),
      JSON.stringify(schema),
    );
    files++;
  }
}
console.log(`crd-schemas: ${files} schemas in ${outDir}`);
