#!/usr/bin/env node
// Turns Kubernetes' OpenAPI v2 document (api/openapi-spec/swagger.json of the k8s.io/kubernetes
// Go module) into the JSON schemas kubeconform reads offline, one file per kind, in its
// standard layout: <out>/<kind>[-<group>]-<version>.json (deployment-apps-v1.json, service-v1.json).
//
// Each file is standalone (the definitions it uses travel with it, so recursive types work) and
// strict, as kubectl validates: every object with declared properties refuses unknown ones.
// int-or-string fields take a string or an integer, quantities a string or a number.
//
// Usage: node deploy/tools/k8s-schemas.mjs <swagger.json> <out-dir>
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [specPath, outDir] = process.argv.slice(2);
if (!specPath || !outDir) {
  console.error("usage: k8s-schemas.mjs <swagger.json> <out-dir>");
  process.exit(2);
}
const definitions = JSON.parse(readFileSync(specPath, "utf8")).definitions;
const QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const REF = "#/definitions/";

/** A definition made strict and lean: no descriptions, unknown fields refused, both forms of numbers. */
function strict(node, name) {
  if (Array.isArray(node)) return node.map((n) => strict(n));
  if (node === null || typeof node !== "object") return node;
  if (name === QUANTITY) return { oneOf: [{ type: "string" }, { type: "number" }] };
  if (node.format === "int-or-string") return { oneOf: [{ type: "string" }, { type: "integer" }] };
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === "description") continue;
    // "properties" maps names to schemas: walk its values, never treat a name as a keyword.
    out[k] =
      k === "properties" ? Object.fromEntries(Object.entries(v).map(([p, s]) => [p, strict(s)])) : strict(v);
  }
  if (out.properties && out.additionalProperties === undefined) out.additionalProperties = false;
  return out;
}

/** Names of every definition reachable from `name`, itself included. */
function closure(name, seen = new Set()) {
  if (seen.has(name)) return seen;
  seen.add(name);
  const walk = (node) => {
    if (Array.isArray(node)) node.forEach(walk);
    else if (node && typeof node === "object") {
      for (const [k, v] of Object.entries(node)) {
        if (k === "$ref" && typeof v === "string" && v.startsWith(REF)) closure(v.slice(REF.length), seen);
        else walk(v);
      }
    }
  };
  walk(definitions[name]);
  return seen;
}

mkdirSync(outDir, { recursive: true });
let files = 0;
for (const [name, def] of Object.entries(definitions)) {
  for (const gvk of def["x-kubernetes-group-version-kind"] ?? []) {
    // Lists and the meta kinds every group repeats (DeleteOptions, WatchEvent, Status) are skipped.
    if (
      !name.startsWith("io.k8s.api.") &&
      !name.startsWith("io.k8s.kube-aggregator.") &&
      !name.startsWith("io.k8s.apiextensions-apiserver.")
    )
      continue;
    if (gvk.kind.endsWith("List")) continue;
    const group = gvk.group ? `-${gvk.group.split(".")[0].toLowerCase()}` : "";
    const file = `${gvk.kind.toLowerCase()}${group}-${gvk.version.toLowerCase()}.json`;
    const schema = strict(def, name);
    const apiVersion = gvk.group ? `${gvk.group}/${gvk.version}` : gvk.version;
    // Pin kind and apiVersion as kubectl would see them.
    schema.properties.kind = { type: "string", enum: [gvk.kind] };
    schema.properties.apiVersion = { type: "string", enum: [apiVersion] };
    const used = [...closure(name)].sort();
    if (used.length > 0)
      schema.definitions = Object.fromEntries(used.map((n) => [n, strict(definitions[n], n)]));
    writeFileSync(join(outDir, file), JSON.stringify(schema));
    files++;
  }
}
console.log(`k8s-schemas: ${files} schemas in ${outDir}`);
