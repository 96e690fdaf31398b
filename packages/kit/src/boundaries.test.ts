import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { checkDomain, isDomainFile, parseImports, scanRepo } from "./boundaries.js";

const REPO = fileURLToPath(new URL("../../..", import.meta.url));
const D = "services/svc/src/domain";

const check = (files: Record<string, string>) => checkDomain(new Map(Object.entries(files)));

describe("parseImports", () => {
  it("reads static, multi-line, type-only, re-export, side-effect, dynamic and require imports", () => {
    const src = [
      'import { a } from "./a.js";',
      "import type { B } from './b.js';",
      "import {",
      "  c,",
      "  type D,",
      '} from "./c.js";',
      'export * from "./e.js";',
      'export type { F } from "./f.js";',
      'import "./side.js";',
      'const g = await import("./g.js");',
      'const h = require("./h.js");',
      'import * as ns from "node:http";',
    ].join("\n");
    expect(parseImports(src)).toEqual([
      { specifier: "./a.js", line: 1, typeOnly: false },
      { specifier: "./b.js", line: 2, typeOnly: true },
      { specifier: "./c.js", line: 3, typeOnly: false },
      { specifier: "./e.js", line: 7, typeOnly: false },
      { specifier: "./f.js", line: 8, typeOnly: true },
      { specifier: "./side.js", line: 9, typeOnly: false },
      { specifier: "./g.js", line: 10, typeOnly: false },
      { specifier: "./h.js", line: 11, typeOnly: false },
      { specifier: "node:http", line: 12, typeOnly: false },
    ]);
  });

  it("ignores comments, template text and look-alikes, and survives quotes in strings and regexes", () => {
    const src = [
      '// import { x } from "../adapters/x.js";',
      '/* import "fastify"; */',
      'const url = "http://example.com"; // a "//" inside a string is not a comment',
      "const quote = /[\"']/;",
      'const t = `import y from "pino"`;',
      "export function span(from: Date, to: Date) { return to.getTime() - from.getTime(); }",
      "const o = { import: 1 }; o.import;",
      'import { real } from "./real.js";',
    ].join("\n");
    expect(parseImports(src)).toEqual([{ specifier: "./real.js", line: 8, typeOnly: false }]);
  });
});

describe("checkDomain", () => {
  it("passes a clean domain: own files, pure libraries, config, proto types, node:crypto", () => {
    expect(
      check({
        [`${D}/a.ts`]: [
          'import { createHash } from "node:crypto";',
          'import { z } from "zod";',
          'import { quoteOf } from "@tollgate/config";',
          'import type { Msg } from "@tollgate/proto";',
          'import { newRequestId } from "@tollgate/kit/ids";',
          'import type { UsageEvent } from "../../../other/src/domain/usage.js";',
          'import { b } from "./b.js";',
        ].join("\n"),
        [`${D}/b.ts`]: 'export const b = 1;\nimport type { T } from "./nested/t.js";',
        [`${D}/nested/t.ts`]: "export type T = string;",
      }),
    ).toEqual([]);
  });

  it("refuses adapters, transport, http, routes and infrastructure packages, with file:line", () => {
    const violations = check({
      [`${D}/bad.ts`]: [
        'import { store } from "../adapters/redis-store.js";',
        'import type { Handler } from "../transport/grpc/handlers.js";',
        'import { reply } from "../http/errors.js";',
        'import type { Route } from "../routes/chat.js";',
        'import type { FastifyInstance } from "fastify";',
        'import { credentials } from "@grpc/grpc-js";',
        'import type Redis from "ioredis";',
        'import { connect } from "@nats-io/transport-node";',
        'import { request } from "undici";',
        'import type { Logger } from "pino";',
        'import { createServer } from "node:http";',
        'import { connect as tcp } from "net";',
        'import { createLogger } from "@tollgate/kit/log";',
        'import { Msg } from "@tollgate/proto";',
        'import { usage } from "../../../other/src/domain/usage.js";',
      ].join("\n"),
    });
    expect(violations.map((v) => `${v.file}:${v.line}`)).toEqual(
      Array.from({ length: 15 }, (_, i) => `${D}/bad.ts:${i + 1}`),
    );
    expect(violations[0]!.message).toContain("imports adapters/");
    expect(violations[1]!.message).toContain("imports transport/");
    expect(violations[14]!.message).toContain("value import of other's domain");
  });

  it("does not check tests or files outside domain/", () => {
    expect(
      check({
        [`${D}/a.test.ts`]: 'import { createMemoryLedger } from "../adapters/memory-ledger.js";',
        "services/svc/src/adapters/redis.ts": 'import Redis from "ioredis";',
        "packages/kit/src/log.ts": 'import pino from "pino";',
      }),
    ).toEqual([]);
    expect(isDomainFile(`${D}/a.ts`)).toBe(true);
    expect(isDomainFile(`${D}/a.test.ts`)).toBe(false);
    expect(isDomainFile("services/svc/src/app.ts")).toBe(false);
  });

  it("refuses an import cycle among a service's domain files, type-only edges included", () => {
    const violations = check({
      [`${D}/a.ts`]: 'import { b } from "./b.js";',
      [`${D}/b.ts`]: 'import type { C } from "./c.js";\nexport const b = 1;',
      [`${D}/c.ts`]: '\nimport type { A } from "./a.js";',
      [`${D}/d.ts`]: 'import { b } from "./b.js";',
    });
    expect(violations).toHaveLength(1);
    expect(violations[0]).toMatchObject({ file: `${D}/a.ts`, line: 1 });
    expect(violations[0]!.message).toContain("import cycle among 3 files");
    expect(violations[0]!.message).toContain("a.ts:1 → b.ts:1 → c.ts:2 → a.ts");
  });

  it("reports a file importing itself, and each separate cycle once", () => {
    const violations = check({
      [`${D}/self.ts`]: 'export type { X } from "./self.js";',
      [`${D}/p.ts`]: 'import "./q.js";',
      [`${D}/q.ts`]: 'import "./p.js";',
      "services/other/src/domain/x.ts": 'import "./y.js";',
      "services/other/src/domain/y.ts": 'import "./x.js";',
    });
    expect(violations.map((v) => v.file)).toEqual([
      "services/other/src/domain/x.ts",
      `${D}/p.ts`,
      `${D}/self.ts`,
    ]);
  });
});

describe("scanRepo and deploy/tools/check-boundaries.ts", () => {
  const trees: string[] = [];
  afterEach(() => {
    for (const t of trees.splice(0)) rmSync(t, { recursive: true, force: true });
  });
  const tree = (files: Record<string, string>) => {
    const root = mkdtempSync(join(tmpdir(), "boundaries-"));
    trees.push(root);
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    return root;
  };
  const run = (root: string) =>
    spawnSync(process.execPath, ["--import", "tsx", "deploy/tools/check-boundaries.ts", root], {
      cwd: REPO,
      encoding: "utf8",
    });

  it("fails on a deliberately bad import and passes once it is gone", () => {
    const bad = tree({
      [`${D}/ok.ts`]: "export const ok = 1;",
      [`${D}/bad.ts`]: '// wired straight to Redis\nimport { store } from "../adapters/redis-store.js";',
      "services/svc/src/adapters/redis-store.ts": 'import Redis from "ioredis";',
    });
    expect(scanRepo(bad).map((v) => `${v.file}:${v.line}`)).toEqual([`${D}/bad.ts:2`]);
    const failed = run(bad);
    expect(failed.status).toBe(1);
    expect(failed.stderr).toContain(`${D}/bad.ts:2: imports adapters/`);

    const clean = tree({ [`${D}/ok.ts`]: 'import { z } from "zod";\nexport const ok = z.string();' });
    expect(scanRepo(clean)).toEqual([]);
    const passed = run(clean);
    expect(passed.stderr).toBe("");
    expect(passed.status).toBe(0);
  });

  it("fails on a cycle", () => {
    const root = tree({
      [`${D}/a.ts`]: 'import type { B } from "./b.js";',
      [`${D}/b.ts`]: 'import type { A } from "./a.js";',
    });
    const failed = run(root);
    expect(failed.status).toBe(1);
    expect(failed.stderr).toContain("import cycle among 2 files");
  });

  it("passes on this checkout", () => {
    expect(scanRepo(REPO)).toEqual([]);
  });
});
