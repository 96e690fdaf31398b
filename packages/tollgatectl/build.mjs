#!/usr/bin/env node
// Builds tollgatectl for use outside the clone: one ES module with every dependency bundled in,
// run by plain `node` (no tsx, no TypeScript, no node_modules), plus a package.json without
// dependencies, so the folder can be packed and installed anywhere (see README.md).
//
// Usage: node packages/tollgatectl/build.mjs [outdir]   (default: packages/tollgatectl/dist/npm)
import { chmodSync, copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const outdir = resolve(process.argv[2] ?? join(here, "dist", "npm"));
const pkg = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
mkdirSync(outdir, { recursive: true });

await build({
  entryPoints: [join(here, "src", "cli.ts")],
  outfile: join(outdir, "tollgatectl.mjs"),
  bundle: true,
  platform: "node",
  target: "node20",
  format: "esm",
  logLevel: "warning",
});
// src/cli.ts starts with a tsx hashbang for use inside the clone; the bundle runs with node.
const bundled = join(outdir, "tollgatectl.mjs");
const code = readFileSync(bundled, "utf8").replace(/^#!.*\n/, "");
writeFileSync(bundled, `#!/usr/bin/env node\n${code}`, { mode: 0o755 });
chmodSync(bundled, 0o755);

writeFileSync(
  join(outdir, "package.json"),
  `${JSON.stringify(
    {
      name: pkg.name,
      version: pkg.version,
      description: pkg.description,
      license: pkg.license,
      type: "module",
      bin: { tollgatectl: "tollgatectl.mjs" },
      files: ["tollgatectl.mjs", "README.md"],
      engines: { node: ">=20" },
    },
    null,
    2,
  )}\n`,
);
copyFileSync(join(here, "README.md"), join(outdir, "README.md"));
process.stdout.write(`${join(outdir, "tollgatectl.mjs")}\n`);
