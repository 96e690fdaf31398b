import { readdirSync, readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

// `make start` runs this package: it ships the demo's stand-ins (@tollgate/demo), never the
// test kit (fixtures, proxies, the stack harness).
const root = new URL("../", import.meta.url);
const pkg = JSON.parse(readFileSync(new URL("package.json", root), "utf8")) as {
  dependencies: Record<string, string>;
};

describe("the all-in-one's start path", () => {
  it("depends on the demo package, not on the test kit", () => {
    expect(Object.keys(pkg.dependencies)).toContain("@tollgate/demo");
    expect(Object.keys(pkg.dependencies)).not.toContain("@tollgate/testkit");
  });

  it("imports nothing from the test kit in its sources", () => {
    const sources = readdirSync(new URL("src/", root)).filter(
      (f) => f.endsWith(".ts") && !f.endsWith(".test.ts"),
    );
    expect(sources.length).toBeGreaterThan(0);
    for (const f of sources)
      expect(readFileSync(new URL(`src/${f}`, root), "utf8"), f).not.toMatch(/@tollgate\/testkit/);
  });
});
