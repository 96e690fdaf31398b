// `make down`: stops what `make up` started, front to back, waiting for each to exit.
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "@tollgate/testkit/stack";

const file = join(REPO_ROOT, ".tollgate", "stack.json");
if (!existsSync(file)) {
  console.log("no stack is running (.tollgate/stack.json is missing)");
  process.exit(0);
}
const { processes } = JSON.parse(readFileSync(file, "utf8")) as {
  processes: { name: string; pid: number }[];
};
const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};
for (const p of [...processes].reverse()) {
  if (!alive(p.pid)) continue;
  process.kill(p.pid, "SIGTERM");
  const deadline = Date.now() + 15_000;
  while (alive(p.pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  if (alive(p.pid)) process.kill(p.pid, "SIGKILL");
  console.log(`stopped ${p.name}`);
}
rmSync(file);
// The stack's per-service internal tokens (packages/testkit/src/internal-auth.ts): they served
// only the processes just stopped; the next `make up` writes new ones.
rmSync(join(REPO_ROOT, ".tollgate", "logs", "internal-auth"), { recursive: true, force: true });
