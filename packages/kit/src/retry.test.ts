import { describe, expect, it, vi } from "vitest";
import { retryLater } from "./retry.js";

const away = new Error("Connection is closed.");
const transient = (err: unknown) => err === away;

describe("retryLater", () => {
  it("tries again while the failure is transient, and stops at the first success", async () => {
    const task = vi.fn().mockRejectedValueOnce(away).mockRejectedValueOnce(away).mockResolvedValue("ok");
    expect(await retryLater(task, transient, { everyMs: 5, forMs: 1_000 })).toBe(true);
    expect(task).toHaveBeenCalledTimes(3);
  });

  it("gives up at once on a lasting error, telling why", async () => {
    const lasting = new Error("reservation budgets changed");
    const task = vi.fn().mockRejectedValue(lasting);
    const onGiveUp = vi.fn();
    expect(await retryLater(task, transient, { everyMs: 5, forMs: 1_000 }, onGiveUp)).toBe(false);
    expect(task).toHaveBeenCalledTimes(1);
    expect(onGiveUp).toHaveBeenCalledWith(lasting);
  });

  it("starts no attempt after its time is up", async () => {
    const task = vi.fn().mockRejectedValue(away);
    const onGiveUp = vi.fn();
    const started = Date.now();
    expect(await retryLater(task, transient, { everyMs: 20, forMs: 100 }, onGiveUp)).toBe(false);
    expect(Date.now() - started).toBeLessThan(400);
    expect(task.mock.calls.length).toBeGreaterThanOrEqual(2);
    expect(task.mock.calls.length).toBeLessThanOrEqual(5);
    expect(onGiveUp).toHaveBeenCalledWith(away);
  });
});
