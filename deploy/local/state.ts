// The record of the stack `make up` started (.tollgate/stack.json), which `make down` stops by.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "@tollgate/testkit/stack";

export const STACK_FILE = join(REPO_ROOT, ".tollgate", "stack.json");

export interface StackProcess {
  name: string;
  pid: number;
}

/** The processes of the recorded stack; empty when there is no record. */
export function recordedStack(): StackProcess[] {
  if (!existsSync(STACK_FILE)) return [];
  return (JSON.parse(readFileSync(STACK_FILE, "utf8")) as { processes: StackProcess[] }).processes;
}

/** Whether a process with this id runs. */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** The recorded stack's processes that still run. */
export function runningStack(): StackProcess[] {
  return recordedStack().filter((p) => alive(p.pid));
}
