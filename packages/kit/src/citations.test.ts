import { describe, expect, it } from "vitest";
import { checkMarkdown, checkSource, commentsOf, outsideCitations, repoPaths } from "./citations.js";

const exists = (paths: string[]) => (p: string) => paths.includes(p);

// The citations these tests feed the check, spelt in parts so this file does not cite them itself.
const ISSUE = "issue";
const NOTES = "notes";
const STYLE = ["STYLE", "md"].join(".");
const ARCH = ["ARCHITECTURE", "md"].join(".");

describe("outsideCitations", () => {
  it("refuses issue numbers, numbered notes, documents outside the tree and spec sections", () => {
    for (const text of [
      `Idempotency-Key on POSTs (${ISSUE} 4)`,
      `see ${ISSUE} #8, part 2`,
      `mppx requires it (${NOTES} 1.8)`,
      `an upstream (${STYLE}, Providers)`,
      `on its own port (${ARCH}: 8081)`,
      'the paid door (spec, "Errors: MPP route")',
      "the voucher is reused (spec rule 4)",
    ]) {
      expect(outsideCitations(text), text).toHaveLength(1);
    }
  });

  it("accepts reasons and docs/ citations", () => {
    expect(outsideCitations('the quote is a sound upper bound (docs/money.md, "The quote")')).toEqual([]);
    expect(outsideCitations("issues a tg_ key; the SSE spec joins data lines; zod issues")).toEqual([]);
  });
});

describe("repoPaths", () => {
  it("finds root-relative paths and leaves placeholders out", () => {
    expect(repoPaths("see docs/money.md, and services/api-edge/src/http/errors.ts.")).toEqual([
      "docs/money.md",
      "services/api-edge/src/http/errors.ts",
    ]);
    const interpolated = `docs/runbooks/${"$"}{s}.md`; // a template literal's placeholder, as code holds it
    expect(repoPaths(`services/<name>/README.md and ${interpolated}`)).toEqual([]);
    expect(repoPaths("node_modules/x/docs/y.md")).toEqual([]);
  });
});

describe("commentsOf", () => {
  it("reads comments and skips strings, templates and regular expressions", () => {
    const src = [
      `const a = "// not a comment (${ISSUE} 4)";`,
      `const r = /${ISSUE} 4\\/x/; // real one`,
      "/** block",
      " * second line */",
      `const t = \`/* not ${"$"}{a} either */\`;`,
    ].join("\n");
    expect(commentsOf(src)).toEqual([
      { line: 2, text: " real one" },
      { line: 3, text: "* block\n * second line " },
    ]);
  });
});

describe("checkSource", () => {
  it("fails on a bad citation and on a missing path, with their lines", () => {
    const src = `const x = 1;\n// retried (${ISSUE} 8)\n// see docs/gone.md and docs/money.md\n`;
    expect(checkSource(src, exists(["docs/money.md"]))).toEqual([
      { line: 2, message: expect.stringContaining("an issue number") },
      { line: 3, message: "cites docs/gone.md, which does not exist" },
    ]);
  });

  it("passes a comment that carries its reason", () => {
    expect(checkSource("// one answer, one bill: docs/money.md\n", exists(["docs/money.md"]))).toEqual([]);
  });
});

describe("checkMarkdown", () => {
  it("fails on a missing link target or backticked path, skips URLs and anchors", () => {
    const md = [
      "[money](money.md#holds) and [gone](decisions/none.md)",
      "[web](https://example.com) [here](#top) `services/api-edge/src/nope.ts`",
    ].join("\n");
    const found = checkMarkdown(md, (p, relative) => (relative ? p === "money.md" : false));
    expect(found).toEqual([
      { line: 1, message: "links decisions/none.md, which does not exist" },
      { line: 2, message: "links services/api-edge/src/nope.ts, which does not exist" },
    ]);
  });

  it("fails on a page citing an issue number, outside notes or the outside specification", () => {
    const md = [
      "What Tollgate adds (issue 7), measured.",
      "The wire format: `notes/mpp-protocol.md`.",
      "## Mapping to the spec (`shared/spec/inference-gateway-spec.md`)",
      "Issues of other gateways, and [money](money.md) notes/ in prose.",
    ].join("\n");
    const found = checkMarkdown(md, () => true).map((f) => [f.line, f.message.split(" (")[0]]);
    expect(found).toEqual([
      [1, "cites an issue number"],
      [2, "cites notes outside the tree"],
      [3, "cites a specification outside the tree"],
    ]);
  });
});
