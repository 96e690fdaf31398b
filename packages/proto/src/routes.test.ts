import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { Route } from "./auth.js";
import {
  allowedMethods,
  OPERATION_NAMES,
  OPERATIONS,
  operationOf,
  ROUTE_IDS,
  ROUTES,
  type RouteDoor,
  type RouteSpec,
  routeLabel,
} from "./routes.js";

const read = (path: string) => readFileSync(new URL(`../../../${path}`, import.meta.url), "utf8");

/** The rows of the first Markdown table after the line starting with `lead`. */
function tableRows(path: string, lead: string): string[][] {
  const lines = read(path).split("\n");
  const start = lines.findIndex((line) => line.startsWith(lead));
  expect(start, `${path} has no line starting with "${lead}"`).toBeGreaterThanOrEqual(0);
  const first = lines.findIndex((line, i) => i > start && line.startsWith("|"));
  const rows: string[][] = [];
  for (let i = first; i < lines.length && lines[i]!.startsWith("|"); i++) {
    rows.push(
      lines[i]!.split("|")
        .slice(1, -1)
        .map((cell) => cell.trim()),
    );
  }
  // rows[0] is the header, rows[1] the separator.
  return rows.slice(2);
}

/** Every `METHOD /path` written in backticks in `text`. */
const labelsIn = (text: string) =>
  [...text.matchAll(/`((?:GET|POST|PUT|PATCH|DELETE|HEAD) \/[^`]*)`/g)].map((m) => m[1]!);

const specs = ROUTE_IDS.map((id) => ROUTES[id] as RouteSpec);
const labelsOn = (...doors: RouteDoor[]) =>
  specs
    .filter((s) => doors.includes(s.door))
    .map(routeLabel)
    .sort();

describe("the route table", () => {
  it("names each method and path once", () => {
    const labels = specs.map(routeLabel);
    expect(new Set(labels).size).toBe(labels.length);
  });

  it("gives every operation an auth contract Route, and every Route but UNSPECIFIED an operation", () => {
    const routes = Object.values(Route).filter((v): v is Route => typeof v === "number");
    expect(routes.filter((r) => r !== Route.UNSPECIFIED && operationOf(r) === undefined)).toEqual([]);
    for (const name of OPERATION_NAMES) expect(operationOf(OPERATIONS[name])).toBe(name);
    expect(operationOf(Route.UNSPECIFIED)).toBeUndefined();
  });

  it("runs an operation on every door but the probes, which run none", () => {
    for (const s of specs) expect(s.operation === null, routeLabel(s)).toBe(s.door === "public");
  });

  it("allows HEAD wherever GET is allowed", () => {
    expect(allowedMethods("/v1/models")).toEqual(["GET", "HEAD"]);
    expect(allowedMethods("/v1/chat/completions")).toEqual(["POST"]);
    expect(allowedMethods("/v1/nothing")).toEqual([]);
  });
});

describe("the docs' route tables and the route table agree", () => {
  it("docs/account-door.md, Routes: every account route and probe, nothing else", () => {
    const rows = tableRows("docs/account-door.md", "## Routes");
    expect(rows.flatMap((r) => labelsIn(r[0] ?? "")).sort()).toEqual(labelsOn("account", "public"));
  });

  it("services/api-edge/README.md, the public port: every route, with its door and whether it streams", () => {
    const rows = tableRows("services/api-edge/README.md", "Public port");
    const documented = rows.flatMap((r) =>
      labelsIn(r[0] ?? "").map((label) => ({ label, door: r[1] ?? "" })),
    );
    expect(documented.map((d) => d.label).sort()).toEqual(labelsOn("account", "paid", "public"));
    for (const { label, door } of documented) {
      const spec = specs.find((s) => routeLabel(s) === label)!;
      expect(door.split(" ")[0], label).toBe(spec.door === "public" ? "none" : spec.door);
      expect(door.includes("SSE"), label).toBe(spec.streams);
    }
  });

  it("docs/contract.md, The two doors: every route of both doors, nothing else", () => {
    const text = read("docs/contract.md");
    const section = text.slice(
      text.indexOf("Tollgate has two public doors"),
      text.indexOf("The official OpenAI SDKs"),
    );
    expect(labelsIn(section).sort()).toEqual(labelsOn("account", "paid"));
  });
});
