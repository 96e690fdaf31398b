import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

/** The repository's root, where a child script resolves the workspace's packages. */
const REPO_ROOT = fileURLToPath(new URL("../../..", import.meta.url));

/**
 * For tests of process-wide behaviour (what a process writes, how often it wakes): runs an ES
 * module `script` under tsx in a child node (with `nodeFlags`) at the repository's root, stdout
 * and stderr piped.
 */
export function childScript(
  script: string,
  nodeFlags: readonly string[] = [],
): ChildProcessWithoutNullStreams {
  return spawn(process.execPath, [...nodeFlags, "--import", "tsx", "--input-type=module", "-e", script], {
    cwd: REPO_ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
}

/** Everything a child wrote to stdout and stderr, and its exit code, once it has closed. */
export function outputOf(
  child: ChildProcessWithoutNullStreams,
): Promise<{ out: string; err: string; code: number | null }> {
  return new Promise((resolve) => {
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString("utf8")));
    child.stderr.on("data", (d: Buffer) => (err += d.toString("utf8")));
    child.on("close", (code) => resolve({ out, err, code }));
  });
}
