// The record of the stack `make up` started (.tollgate/stack.json), which `make down` stops by.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { type RecordedProcess, stillRuns } from "@tollgate/testkit/recorded-process";
import { REPO_ROOT } from "@tollgate/testkit/stack";

export const STACK_FILE = join(REPO_ROOT, ".tollgate", "stack.json");

export interface StackProcess extends RecordedProcess {
  name: string;
}

/** The processes of the recorded stack; empty when there is no record. */
export function recordedStack(): StackProcess[] {
  if (!existsSync(STACK_FILE)) return [];
  return (JSON.parse(readFileSync(STACK_FILE, "utf8")) as { processes: StackProcess[] }).processes;
}

/** The recorded stack's processes that still run (the same programs, not reused ids). */
export function runningStack(): StackProcess[] {
  return recordedStack().filter(stillRuns);
}
