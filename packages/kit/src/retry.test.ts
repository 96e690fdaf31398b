import { describe, expect, it, vi } from "vitest";
import { retrying, untilReachable } from "./retry.js";

const away = new Error("Connection is closed.");
const transient = (err: unknown) => err === away;

describe("retrying", () => {
  it("tries again while the failure is transient, and stops at the first success", async () => {
    const task = vi.fn().mockRejectedValueOnce(away).mockRejectedValueOnce(away).mockResolvedValue("ok");
    expect(await retrying(task, transient, { delayMs: 5, forMs: 1_000 })).toBe("ok");
    expect(task).toHaveBeenCalledTimes(3);
  });

  it("gives up at once on a lasting error, rejecting with it", async () => {
    const lasting = new Error("reservation budgets changed");
    const task = vi.fn().mockRejectedValue(lasting);
    await expect(retrying(task, transient, { delayMs: 5, forMs: 1_000 })).rejects.toBe(lasting);
    expect(task).toHaveBeenCalledTimes(1);
  });

  it("starts no attempt after its time is up, and doubles its pause up to the longest", async () => {
    const at: number[] = [];
    const task = vi.fn(async () => {
      at.push(Date.now());
      throw away;
    });
    const started = Date.now();
    await expect(retrying(task, transient, { delayMs: 20, maxDelayMs: 40, forMs: 150 })).rejects.toBe(away);
    expect(Date.now() - started).toBeLessThan(400);
    // Pauses 20, 40, 40, 40 ms: at most five attempts fit in 150 ms.
    expect(at.length).toBeGreaterThanOrEqual(3);
    expect(at.length).toBeLessThanOrEqual(5);
    expect(at[2]! - at[1]!).toBeGreaterThanOrEqual(35);
  });
});

describe("untilReachable", () => {
  it("tries again while the dependency is unreachable, one warn per try naming it", async () => {
    const warns: Array<Record<string, unknown>> = [];
    const log = { warn: (fields: Record<string, unknown>) => void warns.push(fields) };
    const task = vi.fn().mockRejectedValueOnce(away).mockRejectedValueOnce(away).mockResolvedValue("ok");
    expect(await untilReachable("redis at r:6379", task, transient, log as never)).toBe("ok");
    expect(task).toHaveBeenCalledTimes(3);
    expect(warns.map((w) => [w.dependency, w.attempt])).toEqual([
      ["redis at r:6379", 1],
      ["redis at r:6379", 2],
    ]);
  });

  it("rejects at once with an error that is not about reaching it", async () => {
    const lasting = new Error("Authorization Violation");
    const task = vi.fn().mockRejectedValue(lasting);
    await expect(untilReachable("nats at n:4222", task, transient, { warn: () => {} } as never)).rejects.toBe(
      lasting,
    );
    expect(task).toHaveBeenCalledTimes(1);
  });
});
