import type { CooldownConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { Cooldowns, type ProbeNotice } from "./cooldowns.js";
import type { AttemptFailure, UpstreamFailure } from "./errors.js";
import type { CooldownNotice, ProbeTarget } from "./ports.js";

const COOLDOWN: CooldownConfig = {
  failures: 3,
  windowMs: 10_000,
  durationMs: 30_000,
  maxRetryAfterMs: 60_000,
};

const TARGET: ProbeTarget = { operation: "chat", model: "upstream-model" };
/** A failure no caller's input can cause: no connection could be opened. */
const REFUSED: UpstreamFailure = { kind: "connect_error" };
/** A failure a caller's input can cause: the upstream answered 500 to one prompt. */
const STATUS_500: UpstreamFailure = { kind: "status_5xx" };

/** A probe the test settles by hand: answer() or fail(). */
interface PendingProbe {
  upstreamId: string;
  target: ProbeTarget;
  answer(): Promise<void>;
  fail(kind?: AttemptFailure): Promise<void>;
}

/** Lets the breaker take a settled probe's verdict. */
const settled = () => new Promise<void>((resolve) => setImmediate(resolve));

function breaker(policy: Partial<CooldownConfig> = {}) {
  const clock = { t: 0 };
  const notices: CooldownNotice[] = [];
  const probed: ProbeNotice[] = [];
  const probes: PendingProbe[] = [];
  const cooldowns = new Cooldowns(new Map([["u", { ...COOLDOWN, ...policy }]]), {
    now: () => clock.t,
    probe: {
      probe: (upstreamId, target) =>
        new Promise<AttemptFailure | undefined>((resolve) => {
          probes.push({
            upstreamId,
            target,
            answer: () => {
              resolve(undefined);
              return settled();
            },
            fail: (kind = "status_5xx") => {
              resolve(kind);
              return settled();
            },
          });
        }),
    },
    onCooledDown: (n) => notices.push(n),
    onProbed: (n) => probed.push(n),
  });
  const fail = (n: number, failure: UpstreamFailure) => {
    for (let i = 0; i < n; i++) cooldowns.failure("u", failure, TARGET);
  };
  return { clock, notices, probed, probes, cooldowns, fail };
}

describe("Cooldowns", () => {
  it("opens after `failures` failures within the window, and closes after the duration", () => {
    const { clock, cooldowns, notices, fail } = breaker({ failures: 3, windowMs: 1_000, durationMs: 5_000 });
    fail(1, REFUSED);
    clock.t = 1_500; // the first failure left the window
    fail(2, REFUSED);
    expect(cooldowns.isCooledDown("u")).toBe(false);
    fail(1, REFUSED);
    expect(cooldowns.isCooledDown("u")).toBe(true);
    expect(cooldowns.cooledDownUntil("u")).toBe(6_500);
    clock.t = 6_499;
    expect(cooldowns.isCooledDown("u")).toBe(true);
    clock.t = 6_500;
    expect(cooldowns.isCooledDown("u")).toBe(false);
    expect(notices).toHaveLength(1);
  });

  it("ignores failures of attempts that ran while cooled down, and reopens at the first failure after", () => {
    const { clock, cooldowns, notices, fail } = breaker({ failures: 2, durationMs: 1_000 });
    fail(3, REFUSED);
    expect(notices).toHaveLength(1);
    clock.t = 1_000;
    fail(1, REFUSED);
    expect(cooldowns.isCooledDown("u")).toBe(true);
    expect(notices).toHaveLength(2);
  });

  it("a success after a cooldown ends clears the probation and the count", () => {
    const { clock, cooldowns, fail } = breaker({ failures: 2, durationMs: 1_000 });
    fail(2, REFUSED);
    clock.t = 1_000;
    cooldowns.success("u");
    fail(1, REFUSED);
    expect(cooldowns.isCooledDown("u")).toBe(false);
  });

  it("applies another replica's cooldown without announcing it again, and never shortens one", () => {
    const { clock, cooldowns, notices } = breaker();
    cooldowns.apply({ upstreamId: "u", durationMs: 10_000, reason: "failures" });
    cooldowns.apply({ upstreamId: "u", durationMs: 1_000, reason: "retry_after" });
    cooldowns.apply({ upstreamId: "unknown", durationMs: 1_000, reason: "failures" });
    expect(cooldowns.cooledDownUntil("u")).toBe(clock.t + 10_000);
    expect(cooldowns.isCooledDown("unknown")).toBe(false);
    expect(notices).toEqual([]);
  });

  it("bounds another replica's cooldown by what its own policy could decide: a notice of 49 days skips the upstream for at most maxRetryAfterMs", () => {
    const { clock, cooldowns } = breaker();
    cooldowns.apply({ upstreamId: "u", durationMs: 4_294_967_295, reason: "retry_after" });
    expect(cooldowns.cooledDownUntil("u")).toBe(clock.t + 60_000);
    clock.t += 60_000;
    expect(cooldowns.isCooledDown("u")).toBe(false);
    // Nothing that is not a positive duration changes anything.
    for (const durationMs of [Number.NaN, -1, 0])
      cooldowns.apply({ upstreamId: "u", durationMs, reason: "failures" });
    expect(cooldowns.isCooledDown("u")).toBe(false);
  });
});

describe("Cooldowns, failures a caller's input can cause", () => {
  it("probes the upstream at the threshold instead of cooling it down; an answered probe starts the count again", async () => {
    const { cooldowns, notices, probes, probed, fail } = breaker({ failures: 3 });
    fail(3, STATUS_500);
    expect(cooldowns.isCooledDown("u")).toBe(false);
    expect(probes.map((p) => [p.upstreamId, p.target])).toEqual([["u", TARGET]]);
    await probes[0]!.answer();
    expect(probed).toEqual([{ upstreamId: "u", result: "ok" }]);
    // The count started again: two more content failures reach no threshold, three reach it again.
    fail(2, STATUS_500);
    expect(probes).toHaveLength(1);
    fail(1, STATUS_500);
    expect(probes).toHaveLength(2);
    await probes[1]!.answer();
    expect(cooldowns.isCooledDown("u")).toBe(false);
    expect(notices).toEqual([]);
  });

  it.each<AttemptFailure>([
    "status_5xx",
    "timeout",
    "idle_timeout",
    "total_timeout",
    "interrupted",
    "status_429",
  ])("never cools an upstream that answers its probe down for %s", async (kind) => {
    const { cooldowns, notices, probes, fail } = breaker({ failures: 2 });
    for (let round = 0; round < 5; round++) {
      fail(2, { kind });
      await probes.at(-1)!.answer();
    }
    expect(probes).toHaveLength(5);
    expect(cooldowns.isCooledDown("u")).toBe(false);
    expect(notices).toEqual([]);
  });

  it.each<AttemptFailure>([
    "status_5xx",
    "timeout",
    "connect_error",
    "interrupted",
    "status_429",
    "status_auth",
  ])("cools the upstream down for `durationMs` once its probe fails with %s", async (kind) => {
    const { clock, cooldowns, notices, probes, probed, fail } = breaker({ failures: 3, durationMs: 7_000 });
    fail(3, STATUS_500);
    clock.t = 250;
    await probes[0]!.fail(kind);
    expect(probed).toEqual([{ upstreamId: "u", result: "failed", failure: kind }]);
    expect(notices).toEqual([{ upstreamId: "u", durationMs: 7_000, reason: "failures" }]);
    expect(cooldowns.cooledDownUntil("u")).toBe(7_250);
  });

  it("takes a probe refused as invalid (4xx) for an answer", async () => {
    const { cooldowns, probes, probed, fail } = breaker({ failures: 1 });
    fail(1, STATUS_500);
    await probes[0]!.fail("status_4xx");
    expect(probed).toEqual([{ upstreamId: "u", result: "ok" }]);
    expect(cooldowns.isCooledDown("u")).toBe(false);
  });

  it("sends one probe at a time: failures while it is under way start no other", async () => {
    const { cooldowns, probes, notices, fail } = breaker({ failures: 2 });
    fail(2, STATUS_500);
    fail(10, STATUS_500);
    expect(probes).toHaveLength(1);
    await probes[0]!.fail();
    expect(notices).toHaveLength(1);
    expect(cooldowns.isCooledDown("u")).toBe(true);
  });

  it("drops a probe's verdict when the upstream answered a request or was cooled down meanwhile", async () => {
    const answered = breaker({ failures: 2 });
    answered.fail(2, STATUS_500);
    answered.cooldowns.success("u");
    await answered.probes[0]!.fail();
    expect(answered.cooldowns.isCooledDown("u")).toBe(false);
    expect(answered.notices).toEqual([]);

    const elsewhere = breaker({ failures: 2 });
    elsewhere.fail(2, STATUS_500);
    elsewhere.cooldowns.apply({ upstreamId: "u", durationMs: 1_000, reason: "failures" });
    elsewhere.clock.t = 2_000;
    await elsewhere.probes[0]!.fail();
    // The other replica's cooldown ended; the stale probe does not start another.
    expect(elsewhere.cooldowns.isCooledDown("u")).toBe(false);
    expect(elsewhere.notices).toEqual([]);
  });

  it("cools down at once when every failure in the window is one no caller can cause, and probes when any is not", async () => {
    const certain = breaker({ failures: 3 });
    certain.fail(2, REFUSED);
    certain.fail(1, { kind: "status_auth" });
    expect(certain.cooldowns.isCooledDown("u")).toBe(true);
    expect(certain.probes).toEqual([]);

    // One caller's 500s fill the window: a single refused connection does not cool it down.
    const mixed = breaker({ failures: 3 });
    mixed.fail(2, STATUS_500);
    mixed.fail(1, REFUSED);
    expect(mixed.cooldowns.isCooledDown("u")).toBe(false);
    expect(mixed.probes).toHaveLength(1);
    await mixed.probes[0]!.answer();
    expect(mixed.cooldowns.isCooledDown("u")).toBe(false);
  });

  it("probes on the first such failure after a cooldown ends, instead of cooling down again at once", async () => {
    const { clock, cooldowns, notices, probes, fail } = breaker({ failures: 3, durationMs: 1_000 });
    fail(3, REFUSED);
    clock.t = 1_000;
    fail(1, STATUS_500);
    expect(cooldowns.isCooledDown("u")).toBe(false);
    expect(probes).toHaveLength(1);
    await probes[0]!.answer();
    // The probe cleared the probation: the next 500 starts a count, no probe.
    fail(1, STATUS_500);
    expect(probes).toHaveLength(1);
    expect(notices).toHaveLength(1);
    // A failure no caller can cause still reopens at once in probation.
    const again = breaker({ failures: 3, durationMs: 1_000 });
    again.fail(3, REFUSED);
    again.clock.t = 1_000;
    again.fail(1, REFUSED);
    expect(again.cooldowns.isCooledDown("u")).toBe(true);
  });

  it("keeps its verdict and the process when an observer throws", async () => {
    const clock = { t: 0 };
    let resolveProbe: (kind: AttemptFailure | undefined) => void = () => {};
    const cooldowns = new Cooldowns(new Map([["u", { ...COOLDOWN, failures: 1 }]]), {
      now: () => clock.t,
      probe: { probe: () => new Promise((resolve) => (resolveProbe = resolve)) },
      onCooledDown: () => {
        throw new Error("the broadcast's connection is closed");
      },
    });
    cooldowns.failure("u", STATUS_500, TARGET);
    resolveProbe("status_5xx");
    await settled();
    expect(cooldowns.isCooledDown("u")).toBe(true);
  });

  it("never counts a 4xx, and still honours a Retry-After at once", () => {
    const { cooldowns, notices, probes, fail } = breaker({ failures: 1 });
    fail(50, { kind: "status_4xx" });
    expect(probes).toEqual([]);
    expect(cooldowns.isCooledDown("u")).toBe(false);
    fail(1, { kind: "status_429", retryAfterMs: 2_000 });
    expect(notices).toEqual([{ upstreamId: "u", durationMs: 2_000, reason: "retry_after" }]);
    expect(probes).toEqual([]);
  });
});
