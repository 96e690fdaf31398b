import { spawn } from "node:child_process";
import { join } from "node:path";
import { freePort } from "@tollgate/testkit/fixtures";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { describeAccountDoor, type Target } from "./account-door.js";

/**
 * Starts the all-in-one process exactly as `npm start` does, on embedded defaults (no Redis,
 * no NATS, bundled fake upstream), and reads the demo key from the banner it prints.
 */
async function startAllInOneProcess(): Promise<Target> {
  const port = await freePort();
  const child = spawn(
    process.execPath,
    ["--import", "tsx", join(REPO_ROOT, "packages/all-in-one/src/main.ts")],
    {
      cwd: REPO_ROOT,
      // A free metrics port too, so parallel runs never meet on the default 9090.
      env: { PATH: process.env.PATH, HOME: process.env.HOME, PORT: String(port), METRICS_PORT: "0" },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c: Buffer) => {
    stdout += c.toString("utf8");
  });
  child.stderr.on("data", (c: Buffer) => {
    stderr += c.toString("utf8");
  });
  const deadline = Date.now() + 30_000;
  let match = /demo key: (\S+)/.exec(stderr);
  while (!match) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`all-in-one did not start:\n${stderr}\n${stdout}`);
    }
    await new Promise((r) => setTimeout(r, 100));
    match = /demo key: (\S+)/.exec(stderr);
  }
  return {
    url: `http://127.0.0.1:${port}`,
    key: match[1]!,
    // Logs go to stdout; the banner (with the demo key, on purpose) goes to stderr.
    logs: () => stdout,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once("exit", () => resolve());
        child.kill("SIGTERM");
      }),
  };
}

describeAccountDoor("all-in-one process on embedded defaults", startAllInOneProcess);
