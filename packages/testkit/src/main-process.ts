import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A process started from a main module, as an image or `npm start` runs it, its output kept. */
export interface MainRun {
  child: ChildProcess;
  /** Everything it wrote to stdout so far (its log lines). */
  stdout(): string;
  /** Everything it wrote to stderr so far. */
  stderr(): string;
  /** Its exit code, once it exited. */
  exited: Promise<number | null>;
}

const running: MainRun[] = [];

/** Starts `main` (a .ts file) under tsx with nothing in its environment but PATH, HOME and `env`. */
export function runMain(main: string, env: Record<string, string>): MainRun {
  const child = spawn(process.execPath, ["--import", "tsx", main], {
    env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (c: Buffer) => {
    stdout += c.toString("utf8");
  });
  child.stderr!.on("data", (c: Buffer) => {
    stderr += c.toString("utf8");
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const run = { child, stdout: () => stdout, stderr: () => stderr, exited };
  running.push(run);
  return run;
}

/** Kills every process runMain started that still runs, and waits until each has exited. */
export async function stopMains(): Promise<void> {
  for (const run of running.splice(0)) {
    if (run.child.exitCode === null && run.child.signalCode === null) run.child.kill("SIGKILL");
    await run.exited;
  }
}

/** A Tollgate configuration of one account, one model (upstream on a closed port) and one key of `secret`. */
export function oneKeyConfig(secret: string): string {
  return [
    "upstreams:",
    "  - { id: local, baseUrl: 'http://127.0.0.1:9/v1' }",
    "models:",
    "  - { id: house-model, upstream: local, upstreamModel: m, runtime: vllm, pricing: { inputPerMillion: 1, outputPerMillion: 1 } }",
    "accounts:",
    "  - id: acme",
    "    connections:",
    "      - id: main",
    "        models: [house-model]",
    "        defaultModel: house-model",
    `        keys: [{ id: k1, secret: ${secret} }]`,
    "",
  ].join("\n");
}

/** Writes `text` to a tollgate.yaml of a new temporary directory; its path. */
export function configFile(text: string): string {
  const file = join(mkdtempSync(join(tmpdir(), "tollgate-config-")), "tollgate.yaml");
  writeFileSync(file, text);
  return file;
}
