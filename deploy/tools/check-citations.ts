// Fails when the project's reasoning points outside the repository (`make lint` runs it): a
// comment in services/, packages/, proto/, bench/ or deploy/ that cites an issue number,
// numbered notes, a style or architecture file outside the tree or a spec section; a
// docs/**/*.md page or README.md that cites an issue number, notes or a specification kept
// outside the tree; and any repository path named in a comment or linked from such a page that
// does not exist. The matching rules, and their unit test, are in packages/kit/src/citations.ts.
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { checkMarkdown, checkSource, type Finding } from "../../packages/kit/src/citations.ts";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "../..");
const SKIP = new Set(["node_modules", "dist", ".git", ".tollgate"]);
const GENERATED = join(ROOT, "packages/proto/src/gen");

function* walk(dir: string): Generator<string> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (SKIP.has(entry.name)) continue;
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (path !== GENERATED) yield* walk(path);
    } else yield path;
  }
}

const problems: string[] = [];
const report = (file: string, findings: Finding[]) => {
  for (const f of findings) problems.push(`${relative(ROOT, file)}:${f.line}: ${f.message}`);
};
// A path git ignores (the bench's results, .tollgate/…) is an output the tools write, so it may be
// missing from a clean tree.
const ignored = (abs: string) => spawnSync("git", ["check-ignore", "-q", abs], { cwd: ROOT }).status === 0;
const present = (abs: string) => existsSync(abs) || ignored(abs);
const fromRoot = (p: string) => present(join(ROOT, p));

for (const top of ["services", "packages", "proto", "bench", "deploy"]) {
  for (const file of walk(join(ROOT, top))) {
    if (/\.(ts|mts|mjs|proto)$/.test(file) && !file.endsWith(".d.ts")) {
      report(file, checkSource(readFileSync(file, "utf8"), fromRoot));
    }
  }
}

const pages = [
  ...[...walk(join(ROOT, "docs"))].filter((f) => f.endsWith(".md")),
  ...["services", "packages", "deploy", "bench", "helm"].flatMap((top) =>
    [...walk(join(ROOT, top))].filter((f) => f.endsWith("/README.md")),
  ),
  join(ROOT, "README.md"),
];
for (const page of pages) {
  const here = dirname(page);
  report(
    page,
    checkMarkdown(readFileSync(page, "utf8"), (p, rel) => present(rel ? join(here, p) : join(ROOT, p))),
  );
}

if (problems.length > 0) {
  for (const p of problems) console.error(p);
  console.error(`check-citations: ${problems.length} problem(s); comments carry their reason or cite docs/`);
  process.exit(1);
}
console.log(
  `check-citations: ${pages.length} pages and every comment under services/, packages/, proto/, bench/, deploy/ ok`,
);
