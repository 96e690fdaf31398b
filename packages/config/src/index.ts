import { readFileSync } from "node:fs";
import { ConfigError, describeIssues } from "@tollgate/kit/config";
import { parse } from "yaml";
import { crossCheck, type GatewayConfig, gatewayConfigSchema } from "./schema.js";

export * from "./pricing.js";
export * from "./schema.js";

/** Validates a parsed configuration document; throws ConfigError naming every problem. */
export function parseGatewayConfig(doc: unknown, source = "config"): GatewayConfig {
  const result = gatewayConfigSchema.safeParse(doc);
  const problems = [
    ...(result.success ? [] : describeIssues(result.error.issues, source)),
    ...crossCheck(result.success ? result.data : doc).map((p) => `${source}: ${p}`),
  ];
  if (problems.length > 0 || !result.success) throw new ConfigError(problems);
  return result.data;
}

/** Reads and validates the YAML configuration file at `path`. */
export function loadGatewayConfig(path: string): GatewayConfig {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError([`${path}: cannot read (${(err as NodeJS.ErrnoException).code ?? "error"})`]);
  }
  let doc: unknown;
  try {
    doc = parse(text);
  } catch (err) {
    throw new ConfigError([`${path}: not valid YAML (${(err as Error).message.split("\n")[0]})`]);
  }
  return parseGatewayConfig(doc, path);
}
