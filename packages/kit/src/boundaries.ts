// The layer rule of the services (docs/boundaries.md): a file under services/<name>/src/domain/
// is pure code behind ports. It imports other domain files of its service, pure libraries and a
// short list of shared packages; never adapters, transport, the HTTP layer, or an I/O library.
// And the domain files of a service import each other without a cycle.
//
// Pure functions over file texts (parseImports, checkDomain), plus scanRepo, which reads the
// domain files of a checkout and checks them. deploy/tools/check-boundaries.ts runs scanRepo
// from `make lint`. Test files (*.test.ts) are not checked: a test may wire an adapter in.

import { readdirSync, readFileSync } from "node:fs";
import { join, posix } from "node:path";

/** One import or re-export of a file. */
export interface ImportRef {
  /** The module specifier, as written. */
  specifier: string;
  /** 1-based line of the statement. */
  line: number;
  /** `import type` / `export type`: erased at runtime. */
  typeOnly: boolean;
}

/** One broken rule, at a place in a file. */
export interface Violation {
  /** Path relative to the checkout, with forward slashes. */
  file: string;
  line: number;
  message: string;
}

/** Packages a domain file must not import, types included: I/O, servers, clients, logging. */
const FORBIDDEN_PACKAGES: readonly RegExp[] = [
  /^fastify(\/|$)/,
  /^@fastify\//,
  /^@grpc\//,
  /^ioredis(\/|$)/,
  /^@nats-io\//,
  /^nats(\/|$)/,
  /^undici(\/|$)/,
  /^pino(-[\w-]+)?(\/|$)/,
  /^prom-client(\/|$)/,
];

/** Node built-ins that do I/O; `node:crypto`, `node:util` and the like stay allowed. */
const FORBIDDEN_BUILTINS = new Set([
  "http",
  "https",
  "http2",
  "net",
  "tls",
  "dgram",
  "dns",
  "fs",
  "fs/promises",
  "child_process",
  "cluster",
  "worker_threads",
]);

/** `@tollgate/kit` modules without I/O: the rest wrap pino, gRPC, NATS, Redis, HTTP or env. */
const PURE_KIT_MODULES = new Set(["@tollgate/kit/ids", "@tollgate/kit/retry"]);

const DOMAIN_FILE = /^services\/([^/]+)\/src\/domain\/(.+\.(?:ts|mts))$/;

/** Whether `file` (relative to the checkout) is a domain file the rule applies to. */
export function isDomainFile(file: string): boolean {
  return DOMAIN_FILE.test(file) && !/\.test\.m?ts$/.test(file) && !file.endsWith(".d.ts");
}

/**
 * `source` with comments and string/template/regex contents blanked, keeping every newline and
 * every quote, so offsets and lines stay those of the original and specifiers can be read back
 * from the original text.
 */
function blankComments(source: string): string {
  const out = source.split("");
  const blank = (from: number, to: number) => {
    for (let k = from; k < to; k++) if (out[k] !== "\n") out[k] = " ";
  };
  let i = 0;
  let lastSignificant = "";
  let lastWord = "";
  const n = source.length;
  while (i < n) {
    const c = source[i]!;
    const next = source[i + 1];
    if (c === "/" && next === "/") {
      const end = source.indexOf("\n", i);
      const stop = end === -1 ? n : end;
      blank(i, stop);
      i = stop;
    } else if (c === "/" && next === "*") {
      const end = source.indexOf("*/", i + 2);
      const stop = end === -1 ? n : end + 2;
      blank(i, stop);
      i = stop;
    } else if (c === '"' || c === "'" || c === "`") {
      let j = i + 1;
      while (j < n && source[j] !== c) j += source[j] === "\\" ? 2 : 1;
      // Template contents are blanked too (a nested `${}` holding an import is not looked for).
      if (c === "`") blank(i + 1, Math.min(j, n));
      i = j + 1;
      lastSignificant = c;
      lastWord = "";
    } else if (
      c === "/" &&
      (lastSignificant === "" ||
        "(,=:[!&|?{};+-*%<>~^".includes(lastSignificant) ||
        /^(return|typeof|case|do|else|in|of|new|delete|void|throw|yield|await)$/.test(lastWord))
    ) {
      // A regular expression literal: skip to its closing slash (not one inside a class).
      let j = i + 1;
      let inClass = false;
      while (j < n && source[j] !== "\n") {
        const d = source[j];
        if (d === "\\") j += 2;
        else {
          if (d === "[") inClass = true;
          else if (d === "]") inClass = false;
          else if (d === "/" && !inClass) break;
          j++;
        }
      }
      blank(i + 1, Math.min(j, n));
      i = j + 1;
      lastSignificant = "/";
      lastWord = "";
    } else {
      if (/[\w$]/.test(c)) {
        lastWord = /[\w$]/.test(source[i - 1] ?? "") ? lastWord + c : c;
        lastSignificant = c;
      } else if (!/\s/.test(c)) {
        lastSignificant = c;
        lastWord = "";
      }
      i++;
    }
  }
  return out.join("");
}

const STATEMENTS: readonly RegExp[] = [
  // import x from "m"; import { a, type b } from "m"; export * as ns from "m"; import type ...
  /(?<![\w$.])(import|export)\s+(type\s+)?[\w$\s{},*]*?\bfrom\s*(["'])([^"'\n]+)\3/g,
  // import "m";
  /(?<![\w$.])(import)()\s*(["'])([^"'\n]+)\3/g,
  // import("m"); require("m")
  /(?<![\w$.])(import|require)()\s*\(\s*(["'])([^"'\n]+)\3/g,
];

/** The imports and re-exports of a TypeScript or JavaScript file, in source order. */
export function parseImports(source: string): ImportRef[] {
  const code = blankComments(source);
  const found: { index: number; ref: ImportRef }[] = [];
  for (const pattern of STATEMENTS) {
    for (const m of code.matchAll(pattern)) {
      const index = m.index ?? 0;
      const line = code.slice(0, index).split("\n").length;
      found.push({ index, ref: { specifier: m[4]!, line, typeOnly: Boolean(m[2]) } });
    }
  }
  return found.sort((a, b) => a.index - b.index).map((f) => f.ref);
}

/** Where a relative specifier of `file` points, as a checkout path of the source file. */
function resolveRelative(file: string, specifier: string, known: ReadonlySet<string>): string {
  const target = posix.normalize(posix.join(posix.dirname(file), specifier));
  const candidates = [
    target.replace(/\.js$/, ".ts").replace(/\.mjs$/, ".mts"),
    target,
    `${target}.ts`,
    `${target}/index.ts`,
  ];
  return candidates.find((c) => known.has(c)) ?? candidates[0]!;
}

/** Why `ref` of a domain file of `service` breaks the rule; undefined when allowed. */
function refusal(service: string, ref: ImportRef, target: string | undefined): string | undefined {
  const spec = ref.specifier;
  if (target !== undefined) {
    const own = `services/${service}/src/domain/`;
    if (target.startsWith(own)) return undefined;
    const other = /^services\/([^/]+)\/src\/domain\//.exec(target);
    if (other) {
      return ref.typeOnly
        ? undefined
        : `value import of ${other[1]}'s domain ("${spec}"): import its types only (import type), or move the shared code to packages/`;
    }
    const layer = new RegExp(`^services/${service}/src/([^/]+)`).exec(target)?.[1];
    const where = layer ? `${layer}/` : target;
    return `imports ${where} ("${spec}"): the domain may import only its own domain/ files; declare the type or port in domain/ and let the outer layer implement it`;
  }
  const builtin = spec.startsWith("node:") ? spec.slice(5) : spec;
  if (FORBIDDEN_BUILTINS.has(builtin))
    return `imports the I/O module "${spec}": do I/O in an adapter behind a port`;
  if (FORBIDDEN_PACKAGES.some((p) => p.test(spec))) {
    return `imports "${spec}" (infrastructure): keep it in adapters/ or transport/ and reach it through a port`;
  }
  if (spec === "@tollgate/config" || spec.startsWith("@tollgate/config/")) return undefined;
  if (spec === "@tollgate/proto" || spec.startsWith("@tollgate/proto/")) {
    return ref.typeOnly
      ? undefined
      : `value import of "${spec}": the wire format is transport's; import types only (import type)`;
  }
  if (spec.startsWith("@tollgate/kit/") && PURE_KIT_MODULES.has(spec)) return undefined;
  if (spec.startsWith("@tollgate/kit/")) {
    return `imports "${spec}" (runtime kit: logging, clients, servers, env): the domain may use only ${[...PURE_KIT_MODULES].join(", ")} of it`;
  }
  if (spec.startsWith("@tollgate/")) {
    return `imports "${spec}": the domain may use @tollgate/config, types of @tollgate/proto and ${[...PURE_KIT_MODULES].join(", ")}`;
  }
  return undefined;
}

/**
 * Checks domain files: every import against the layer rule, and the relative imports between
 * the domain files of each service for cycles. `files` maps checkout paths (forward slashes) to
 * file texts; files that are not domain files (isDomainFile) are ignored.
 */
export function checkDomain(files: ReadonlyMap<string, string>): Violation[] {
  const domain = [...files.keys()].filter(isDomainFile).sort();
  const known = new Set(domain);
  const violations: Violation[] = [];
  /** Per domain file: the domain files of its service it imports, with the line. */
  const edges = new Map<string, { to: string; line: number }[]>();
  for (const file of domain) {
    const service = DOMAIN_FILE.exec(file)![1]!;
    const out: { to: string; line: number }[] = [];
    for (const ref of parseImports(files.get(file)!)) {
      const target = ref.specifier.startsWith(".") ? resolveRelative(file, ref.specifier, known) : undefined;
      const why = refusal(service, ref, target);
      if (why) violations.push({ file, line: ref.line, message: why });
      if (target !== undefined && known.has(target) && target.startsWith(`services/${service}/src/domain/`)) {
        out.push({ to: target, line: ref.line });
      }
    }
    edges.set(file, out);
  }
  violations.push(...cycles(domain, edges));
  return violations.sort((a, b) => a.file.localeCompare(b.file) || a.line - b.line);
}

/** One violation per strongly connected group of domain files (Tarjan), showing one cycle of it. */
function cycles(
  nodes: readonly string[],
  edges: ReadonlyMap<string, { to: string; line: number }[]>,
): Violation[] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const groups: string[][] = [];
  let counter = 0;
  const visit = (v: string) => {
    index.set(v, counter);
    low.set(v, counter);
    counter++;
    stack.push(v);
    onStack.add(v);
    for (const { to } of edges.get(v) ?? []) {
      if (!index.has(to)) {
        visit(to);
        low.set(v, Math.min(low.get(v)!, low.get(to)!));
      } else if (onStack.has(to)) {
        low.set(v, Math.min(low.get(v)!, index.get(to)!));
      }
    }
    if (low.get(v) === index.get(v)) {
      const group: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        group.push(w);
      } while (w !== v);
      const selfLoop = (edges.get(v) ?? []).some((e) => e.to === v);
      if (group.length > 1 || selfLoop) groups.push(group.sort());
    }
  };
  for (const v of nodes) if (!index.has(v)) visit(v);

  return groups.map((group) => {
    const members = new Set(group);
    const start = group[0]!;
    // Shortest way back to `start` inside the group: one concrete cycle to read.
    const prev = new Map<string, { from: string; line: number }>();
    const queue = [start];
    let closing: { from: string; line: number } | undefined;
    while (queue.length > 0 && !closing) {
      const v = queue.shift()!;
      for (const e of edges.get(v) ?? []) {
        if (!members.has(e.to)) continue;
        if (e.to === start) {
          closing = { from: v, line: e.line };
          break;
        }
        if (!prev.has(e.to)) {
          prev.set(e.to, { from: v, line: e.line });
          queue.push(e.to);
        }
      }
    }
    const hops: string[] = [];
    let at = closing!.from;
    hops.unshift(`${posix.basename(at)}:${closing!.line}`);
    while (at !== start) {
      const p = prev.get(at)!;
      hops.unshift(`${posix.basename(p.from)}:${p.line}`);
      at = p.from;
    }
    const firstLine = Number(hops[0]!.split(":")[1]);
    const dir = posix.dirname(start);
    return {
      file: start,
      line: firstLine,
      message:
        `import cycle among ${group.length} files of ${dir}/ (${group.map((g) => posix.basename(g)).join(", ")}): ` +
        `${hops.join(" → ")} → ${posix.basename(start)}; move the shared types to a module that imports none of them`,
    };
  });
}

/** Reads every domain file under `root` (a checkout) and checks them (checkDomain). */
export function scanRepo(root: string): Violation[] {
  const files = new Map<string, string>();
  const walk = (rel: string) => {
    for (const entry of readdirSync(join(root, rel), { withFileTypes: true })) {
      const path = `${rel}/${entry.name}`;
      if (entry.isDirectory()) walk(path);
      else if (isDomainFile(path)) files.set(path, readFileSync(join(root, path), "utf8"));
    }
  };
  let services: string[] = [];
  try {
    services = readdirSync(join(root, "services"));
  } catch {
    return [];
  }
  for (const service of services) {
    const rel = `services/${service}/src/domain`;
    try {
      walk(rel);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== "ENOENT" && code !== "ENOTDIR") throw err;
    }
  }
  return checkDomain(files);
}

/** A violation as one line: `file:line: message`. */
export function formatViolation(v: Violation): string {
  return `${v.file}:${v.line}: ${v.message}`;
}
