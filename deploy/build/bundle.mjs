#!/usr/bin/env node
// Bundles one service's src/main.ts, with its workspace packages and every third-party
// dependency, into one ES module, services/<name>/dist/main.mjs, plus the few data files a
// dependency reads at run time (dist/assets/). The image's runtime stage runs that file with
// plain `node`: no tsx, no TypeScript, no node_modules.
//
// Usage: node deploy/build/bundle.mjs [service-dir]   (default: the current directory, which is
// what `npm run build --workspace services/<name>` gives).
import { cpSync, existsSync, readFileSync, rmSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { dirname, join, relative, resolve, sep } from "node:path";
import { build } from "esbuild";

const dir = resolve(process.argv[2] ?? process.cwd());
const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
const outdir = join(dir, "dist");
const outfile = join(outdir, "main.mjs");

// Data files that bundled dependencies read from their own folder at run time, relative to a
// node_modules folder. grpc-health-check loads its .proto when imported (kit/health.ts);
// tiny-secp256k1 its WebAssembly on mpp-payment's first voucher recovery (vouchers.ts).
const ASSETS = ["grpc-health-check/proto", "tiny-secp256k1/lib/secp256k1.wasm"];
const ASSET_PACKAGES = new Set(ASSETS.map((a) => a.split("/")[0]));

/** Path below the last node_modules folder, with forward slashes: "grpc-health-check/build/src/health.js". */
function inNodeModules(path) {
  const marker = `${sep}node_modules${sep}`;
  const at = path.lastIndexOf(marker);
  return at < 0
    ? undefined
    : path
        .slice(at + marker.length)
        .split(sep)
        .join("/");
}

// A CommonJS file that uses __dirname or __filename gets them pointed at its copy under
// dist/assets/, so `${__dirname}/../../proto` still finds the data listed in ASSETS. The
// declaration goes after any leading comments and "use strict", which must stay first.
const PROLOGUE = /^(?:\s|\/\/[^\n]*\n|\/\*[\s\S]*?\*\/)*(?:(["'])use strict\1;?)?/;
//
// An ES module of a package with data in ASSETS that finds its data by `import.meta.url` gets
// that pointed at its copy under dist/assets/ the same way (in the bundle, import.meta.url is the
// bundle's own address).
const dirnamePlugin = {
  name: "tollgate-dirname",
  setup(b) {
    b.onLoad({ filter: /[\\/]node_modules[\\/].*\.c?js$/ }, async (args) => {
      const text = await readFile(args.path, "utf8");
      const rel = inNodeModules(args.path);
      if (rel !== undefined && ASSET_PACKAGES.has(rel.split("/")[0]) && text.includes("import.meta.url")) {
        const url = `new URL(${JSON.stringify(`./assets/${rel}`)}, import.meta.url).href`;
        return {
          contents: text.replaceAll("import.meta.url", url),
          loader: "js",
          resolveDir: dirname(args.path),
        };
      }
      if (!/\b__(?:dirname|filename)\b/.test(text)) return undefined;
      if (/\b(?:var|let|const|function)\s+__(?:dirname|filename)\b/.test(text)) return undefined;
      if (rel === undefined) return undefined;
      const decl =
        `var __dirname = __tollgateAssets + ${JSON.stringify(`/${rel.slice(0, rel.lastIndexOf("/"))}`)},` +
        ` __filename = __tollgateAssets + ${JSON.stringify(`/${rel}`)};`;
      const head = PROLOGUE.exec(text)?.[0] ?? "";
      return {
        contents: `${head};${decl}${text.slice(head.length)}`,
        loader: "js",
        resolveDir: dirname(args.path),
      };
    });
  },
};

rmSync(join(outdir, "assets"), { recursive: true, force: true });
const result = await build({
  entryPoints: [join(dir, "src", "main.ts")],
  outfile,
  bundle: true,
  platform: "node",
  target: "node20",
  format: "esm",
  // CommonJS dependencies call require() for Node built-ins: give the ES module one; and the
  // folder the data files sit in.
  banner: {
    js: [
      'import { createRequire as __tollgateCreateRequire } from "node:module";',
      'import { fileURLToPath as __tollgateFileURLToPath } from "node:url";',
      "const require = __tollgateCreateRequire(import.meta.url);",
      'const __tollgateAssets = __tollgateFileURLToPath(new URL("./assets", import.meta.url));',
    ].join(" "),
  },
  define: { "process.env.NODE_ENV": '"production"' },
  plugins: [dirnamePlugin],
  // Identifiers are kept, not renamed: functions and classes keep their names (stack traces,
  // `err.constructor.name` in logs) without esbuild's keepNames, which wraps every function
  // expression in a call that redefines its `name` each time the function is created, closures
  // made per request in every bundled library included. Measured (docs/performance.md, "The
  // bundles' names"): 0.06–0.12 ms less CPU per request at 1 connection, 10–15 MB less idle
  // RSS per service.
  minifyWhitespace: true,
  minifySyntax: true,
  minifyIdentifiers: false,
  keepNames: false,
  legalComments: "linked",
  sourcemap: "linked",
  logLevel: "warning",
  metafile: true,
});

// Copy the data files of the dependencies that made it into the bundle.
const bundled = new Set(
  Object.keys(result.metafile.inputs).map((p) => inNodeModules(resolve(p))?.split("/")[0]),
);
for (const asset of ASSETS) {
  if (!bundled.has(asset.split("/")[0])) continue;
  const from = join(dir, "node_modules", asset);
  const source = existsSync(from) ? from : join(dir, "..", "..", "node_modules", asset);
  cpSync(source, join(outdir, "assets", asset), { recursive: true });
}

const bytes = Object.values(result.metafile.outputs).reduce((n, o) => n + o.bytes, 0);
console.log(
  `${pkg.name}: ${relative(process.cwd(), outfile) || outfile} (${(bytes / 1024 / 1024).toFixed(1)} MiB)`,
);
