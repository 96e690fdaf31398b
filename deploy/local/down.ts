// `make down`: stops what `make up` started, front to back, waiting for each to exit.
import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import { stillRuns } from "@tollgate/testkit/recorded-process";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { recordedStack, STACK_FILE } from "./state.js";

if (!existsSync(STACK_FILE)) {
  console.log("no stack is running (.tollgate/stack.json is missing)");
  process.exit(0);
}
const processes = recordedStack();
for (const p of [...processes].reverse()) {
  if (!stillRuns(p)) continue;
  process.kill(p.pid, "SIGTERM");
  const deadline = Date.now() + 15_000;
  while (stillRuns(p) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  if (stillRuns(p)) process.kill(p.pid, "SIGKILL");
  console.log(`stopped ${p.name}`);
}
rmSync(STACK_FILE);
// The stack's per-service internal tokens (packages/testkit/src/internal-auth.ts): they served
// only the processes just stopped; the next `make up` writes new ones.
rmSync(join(REPO_ROOT, ".tollgate", "logs", "internal-auth"), { recursive: true, force: true });
