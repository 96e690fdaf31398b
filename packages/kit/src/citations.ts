/**
 * The matching rules of `deploy/tools/check-citations.ts`, the lint step that keeps the
 * project's reasoning inside the repository: a comment may not cite a place outside the tree
 * (an issue number, numbered notes, a style or architecture file that does not exist, a spec
 * section the reader cannot open), and every repository path a comment or a Markdown page
 * names must exist. Pure functions: the script does the file walking.
 */

/** One comment of a source file, with the 1-based line it starts on. */
export interface Comment {
  line: number;
  text: string;
}

/** One problem found, ready to print as `file:line: message`. */
export interface Finding {
  line: number;
  message: string;
}

type Rule = { pattern: RegExp; what: string };

/** An issue number: refused in comments and pages alike. */
const ISSUE_NUMBER: Rule = { pattern: /\bissues?\s*#?\s*\d+/i, what: "an issue number" };

/** Citations of things outside the tree, each with the reason it is refused. */
const OUTSIDE: readonly Rule[] = [
  ISSUE_NUMBER,
  { pattern: /\bissue:\s*"/i, what: "an issue" },
  { pattern: /\bnotes\s+\d+(\.\d+)*/i, what: "numbered notes" },
  { pattern: /\bSTYLE\.md\b/, what: "a style guide outside the tree" },
  { pattern: /\bARCHITECTURE(\.md)?\b/, what: "an architecture document outside the tree" },
  {
    pattern: /\(spec\b|\bspec,?\s+"|\bspec,?\s+(payment\s+|MPP\s+(route\s+)?)?rules?\s+\d/i,
    what: "a spec section",
  },
];

/**
 * What a Markdown page may not cite either: an issue number, or notes and a specification kept
 * outside the tree. A page says the reason itself or links the docs/ page that does.
 */
const PAGE_OUTSIDE: readonly Rule[] = [
  ISSUE_NUMBER,
  { pattern: /(?<![\w/])notes\/[\w.-]+/, what: "notes outside the tree" },
  { pattern: /\bshared\/spec\b|inference-gateway-spec/, what: "a specification outside the tree" },
];

/** Top-level folders whose paths a comment or a page may cite. */
const ROOTS = ["docs", "services", "packages", "proto", "deploy", "helm", "bench"];

const PATH = new RegExp(`(?<![\\w./-])(?:${ROOTS.join("|")})/[A-Za-z0-9_.\\-/<>\${}*]*`, "g");

/** The citations of things outside the tree in one comment's text (or a page's line, with PAGE_OUTSIDE). */
export function outsideCitations(text: string, rules = OUTSIDE): string[] {
  const found: string[] = [];
  for (const { pattern, what } of rules) {
    const m = pattern.exec(text);
    if (m !== null) found.push(`cites ${what} ("${m[0]}"): say the reason here or cite a docs/ path`);
  }
  return found;
}

/**
 * Repository paths named in a text, relative to the repository root: words that start with one
 * of the top-level folders. A path with a placeholder (`services/<name>/README.md`,
 * `docs/runbooks/${s}.md`) names a family, not a file, and is left out.
 */
export function repoPaths(text: string): string[] {
  const paths: string[] = [];
  for (const m of text.matchAll(PATH)) {
    if (/[<>${}*]/.test(m[0])) continue;
    paths.push(m[0].replace(/[./-]+$/, ""));
  }
  return paths;
}

/**
 * The comments of a TypeScript (or .proto) source: `//` lines and `/* … *\/` blocks, outside
 * strings, template literals and regular expression literals.
 */
export function commentsOf(source: string): Comment[] {
  const comments: Comment[] = [];
  let line = 1;
  let i = 0;
  let prev = ""; // the last significant character outside comments, to tell a regex from a division
  const n = source.length;
  while (i < n) {
    const c = source[i];
    const d = source[i + 1];
    if (c === "\n") {
      line++;
      i++;
    } else if (c === "/" && d === "/") {
      const end = source.indexOf("\n", i);
      const stop = end === -1 ? n : end;
      comments.push({ line, text: source.slice(i + 2, stop) });
      i = stop;
    } else if (c === "/" && d === "*") {
      const end = source.indexOf("*/", i + 2);
      const stop = end === -1 ? n : end + 2;
      const text = source.slice(i + 2, end === -1 ? n : end);
      comments.push({ line, text });
      line += text.split("\n").length - 1;
      i = stop;
    } else if (
      c === '"' ||
      c === "'" ||
      c === "`" ||
      (c === "/" && /^$|[(,=:[!&|?{};+\-*%<>~^]$/.test(prev))
    ) {
      i++;
      while (i < n && source[i] !== c) {
        if (source[i] === "\\") i++;
        else if (c === "/" && source[i] === "[") {
          while (i < n && source[i] !== "]") i += source[i] === "\\" ? 2 : 1;
        }
        if (source[i] === "\n") line++;
        i++;
      }
      i++;
      prev = c;
    } else {
      if (!/\s/.test(c ?? "")) prev = c ?? "";
      i++;
    }
  }
  return comments;
}

/** The links of a Markdown page that point inside the repository, with their lines. */
export function markdownTargets(
  markdown: string,
): Array<{ line: number; target: string; relative: boolean }> {
  const targets: Array<{ line: number; target: string; relative: boolean }> = [];
  markdown.split("\n").forEach((text, k) => {
    for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      const raw = m[1] ?? "";
      if (/^[a-z][a-z0-9+.-]*:/i.test(raw) || raw.startsWith("#")) continue;
      const target = raw.split("#")[0] ?? "";
      if (target !== "") targets.push({ line: k + 1, target, relative: true });
    }
    for (const m of text.matchAll(/`([^`]+)`/g)) {
      for (const p of repoPaths(m[1] ?? "")) targets.push({ line: k + 1, target: p, relative: false });
    }
  });
  return targets;
}

/**
 * Everything wrong with one source file's comments: citations of things outside the tree, and
 * repository paths for which `exists` (given a root-relative path) says no.
 */
export function checkSource(source: string, exists: (path: string) => boolean): Finding[] {
  const findings: Finding[] = [];
  for (const { line, text } of commentsOf(source)) {
    for (const message of outsideCitations(text)) findings.push({ line, message });
    for (const p of repoPaths(text)) {
      if (!exists(p)) findings.push({ line, message: `cites ${p}, which does not exist` });
    }
  }
  return findings;
}

/**
 * The links and backticked repository paths of one Markdown page that do not exist, and its
 * citations of things outside the tree. `exists` takes a path relative to the page's folder
 * when `relative`, else relative to the root.
 */
export function checkMarkdown(
  markdown: string,
  exists: (path: string, relative: boolean) => boolean,
): Finding[] {
  const findings = markdownTargets(markdown)
    .filter(({ target, relative }) => !exists(target, relative))
    .map(({ line, target }) => ({ line, message: `links ${target}, which does not exist` }));
  markdown.split("\n").forEach((text, k) => {
    for (const message of outsideCitations(text, PAGE_OUTSIDE)) findings.push({ line: k + 1, message });
  });
  return findings.sort((a, b) => a.line - b.line);
}
