import { describe, expect, it } from "vitest";
import { childScript, outputOf } from "./child-script.js";
import { stepsDeadline, stopDeadline, withinDeadline } from "./shutdown.js";

describe("a stop's deadline", () => {
  it("counts down from when it is made and never below zero", () => {
    let now = 1_000;
    const d = stopDeadline(500, () => now);
    expect(d.remainingMs()).toBe(500);
    now = 1_300;
    expect(d.remainingMs()).toBe(200);
    now = 9_000;
    expect(d.remainingMs()).toBe(0);
  });

  it("keeps back what follows the steps: 1 s of a long bound, a fifth of a short one", () => {
    const now = () => 0;
    expect(stepsDeadline(25_000, now).remainingMs()).toBe(24_000);
    expect(stepsDeadline(125_000, now).remainingMs()).toBe(124_000);
    expect(stepsDeadline(1_000, now).remainingMs()).toBe(800);
    expect(stepsDeadline(3_000, now).remainingMs()).toBe(2_400);
  });

  it("caps a step's own wait at what is left, and leaves it alone without a deadline", () => {
    let now = 0;
    const d = stopDeadline(4_000, () => now);
    expect(withinDeadline(10_000, d)).toBe(4_000);
    expect(withinDeadline(1_000, d)).toBe(1_000);
    now = 5_000;
    expect(withinDeadline(10_000, d)).toBe(0);
    expect(withinDeadline(10_000, undefined)).toBe(10_000);
  });
});

describe("onShutdown", () => {
  it("on SIGTERM hands the app's stop the deadline of its steps, and exits 0 once it is done", async () => {
    // A stop that reports what it was given: 3 s of bound leaves 2.4 s to the steps.
    const p = childScript(
      `import { onShutdown } from "@tollgate/kit/shutdown"; import { createLogger } from "@tollgate/kit/log"; const log = createLogger({ service: "t", level: "silent" }); onShutdown({ stop: async (d) => { console.error(JSON.stringify({ left: d?.remainingMs() })); } }, log, 3_000); console.error("ready"); setTimeout(() => {}, 10_000);`,
    );
    const done = outputOf(p);
    await new Promise<void>((resolve) => {
      let err = "";
      p.stderr.on("data", (d: Buffer) => {
        err += d.toString("utf8");
        if (err.includes("ready")) resolve();
      });
    });
    p.kill("SIGTERM");
    const { err, code } = await done;
    expect(code).toBe(0);
    const line = err.split("\n").find((l) => l.startsWith("{"));
    const left = (JSON.parse(line ?? "{}") as { left?: number }).left;
    expect(left).toBeGreaterThan(2_000);
    expect(left).toBeLessThanOrEqual(2_400);
  });
});
