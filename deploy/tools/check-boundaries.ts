// Fails when a domain file breaks the layer rule of docs/boundaries.md: an import of adapters,
// transport, the HTTP layer or an I/O library, or an import cycle among a service's domain files.
// Prints every violation as file:line. Run by `make lint`.
//
// Usage: npx tsx deploy/tools/check-boundaries.ts [checkout-root]
import { resolve } from "node:path";
import { formatViolation, scanRepo } from "../../packages/kit/src/boundaries.js";

const root = resolve(process.argv[2] ?? ".");
const violations = scanRepo(root);
for (const v of violations) console.error(formatViolation(v));
if (violations.length > 0) {
  console.error(
    `${violations.length} boundary violation(s) in services/*/src/domain: see docs/boundaries.md`,
  );
  process.exit(1);
}
