import { type ChildProcess, spawn } from "node:child_process";

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
