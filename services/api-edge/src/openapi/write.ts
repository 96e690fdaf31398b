// npm run openapi: writes docs/openapi/*.yaml from the generator; with --check, writes nothing
// and fails when a committed document differs.

import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { committedDocuments } from "./committed.js";

const check = process.argv.includes("--check");
let stale = 0;
for (const { file, text } of committedDocuments()) {
  const path = fileURLToPath(file);
  const current = (() => {
    try {
      return readFileSync(path, "utf8");
    } catch {
      return undefined;
    }
  })();
  if (current === text) continue;
  if (check) {
    stale++;
    process.stderr.write(`${path} differs from the generator's output: run npm run openapi\n`);
  } else {
    writeFileSync(path, text);
    process.stdout.write(`wrote ${path}\n`);
  }
}
if (stale > 0) process.exit(1);
