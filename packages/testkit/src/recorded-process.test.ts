import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { commandLineOf, stillRuns } from "./recorded-process.js";

describe("a process make up recorded", () => {
  it("still runs only while its id names the same command line: a reused id is somebody else's", async () => {
    const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      const pid = child.pid!;
      const commandLine = commandLineOf(pid);
      expect(stillRuns({ pid, ...(commandLine !== undefined ? { commandLine } : {}) })).toBe(true);
      if (commandLine !== undefined) {
        // The same id, another program (as after a reboot): not ours, so never stopped as ours.
        expect(stillRuns({ pid, commandLine: "/usr/sbin/sshd\0-D\0" })).toBe(false);
      }
    } finally {
      child.kill("SIGKILL");
      await exited;
    }
    expect(stillRuns({ pid: child.pid! })).toBe(false);
  });
});
