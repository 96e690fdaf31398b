import { readFileSync } from "node:fs";

/** A process as `make up` records it: its id and, where the system shows it, its command line. */
export interface RecordedProcess {
  pid: number;
  /** /proc/<pid>/cmdline when recorded (Linux); absent elsewhere and in older records. */
  commandLine?: string;
}

/** A process's command line as the system shows it (Linux's /proc), or undefined. */
export function commandLineOf(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8");
  } catch {
    return undefined;
  }
}

/**
 * Whether the recorded process still runs: its id is alive and, when its command line was
 * recorded and can be read now, it is the same one. Ids are reused (after a reboot, say), so an
 * id alone could name another program, which `make down` would then stop.
 */
export function stillRuns(p: RecordedProcess): boolean {
  try {
    process.kill(p.pid, 0);
  } catch {
    return false;
  }
  if (p.commandLine === undefined) return true;
  const now = commandLineOf(p.pid);
  return now === undefined || now === p.commandLine;
}
