import type { CooldownConfig, RetryConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { Cooldowns } from "./cooldowns.js";
import { type AttemptFailure, InferenceError } from "./errors.js";
import { type FailoverMember, FailoverProvider, order } from "./failover.js";
import type {
  CooldownNotice,
  ProbeTarget,
  Provider,
  ProviderChunk,
  ProviderRequest,
  ProviderResult,
} from "./ports.js";

/** One scripted attempt: an answer, a failure, or (streams) some chunks and then a failure. */
type Step = "ok" | { fail: AttemptFailure; retryAfterMs?: number; afterChunks?: number; takesMs?: number };

const CHUNKS = 3;

/** A fake per-attempt provider: plays its steps in order and records every attempt. */
class ScriptedProvider implements Provider {
  readonly attempts: ProviderRequest[] = [];
  constructor(
    readonly id: string,
    private readonly steps: Step[],
    private readonly clock: Clock,
  ) {}

  #step(req: ProviderRequest): Step {
    this.attempts.push(req);
    const step = this.steps.shift() ?? "ok";
    if (step !== "ok" && step.takesMs) this.clock.t += step.takesMs;
    return step;
  }

  async complete(req: ProviderRequest): Promise<ProviderResult> {
    const step = this.#step(req);
    if (step !== "ok") throw failure(step);
    return { json: { answer: this.id }, usage: { inputTokens: 1, outputTokens: 1, reasoningTokens: 0 } };
  }

  async *stream(req: ProviderRequest): AsyncGenerator<ProviderChunk> {
    const step = this.#step(req);
    const cut = step === "ok" ? CHUNKS : (step.afterChunks ?? 0);
    for (let i = 0; i < cut; i++) yield { json: { n: i, from: this.id }, usage: undefined };
    if (step !== "ok") throw failure(step);
  }
}

function failure(step: Exclude<Step, "ok">): InferenceError {
  const code = step.fail === "status_4xx" ? "upstream_rejected" : "upstream_error";
  return new InferenceError(code, step.fail, {
    kind: step.fail,
    ...(step.retryAfterMs !== undefined ? { retryAfterMs: step.retryAfterMs } : {}),
  });
}

interface Clock {
  t: number;
}

const RETRY: RetryConfig = { maxAttempts: 3, baseBackoffMs: 100, maxBackoffMs: 2_000 };
const COOLDOWN: CooldownConfig = {
  failures: 3,
  windowMs: 10_000,
  durationMs: 30_000,
  maxRetryAfterMs: 60_000,
};

interface Setup {
  upstreams: Record<string, Step[]>;
  /** How each upstream answers a probe (undefined: answered); by default every probe fails with a 5xx. */
  probes?: Record<string, AttemptFailure | undefined>;
  members?: Array<{ id: string; priority?: number; weight?: number; upstreamModel?: string }>;
  retry?: Partial<RetryConfig>;
  cooldown?: Partial<CooldownConfig>;
  deadlineMs?: number;
  random?: () => number;
}

function setup(s: Setup) {
  const clock: Clock = { t: 1_000_000 };
  const sleeps: number[] = [];
  const notices: CooldownNotice[] = [];
  const events: string[] = [];
  const providers = new Map(
    Object.entries(s.upstreams).map(([id, steps]) => [id, new ScriptedProvider(id, steps, clock)]),
  );
  const probes: Array<{ upstreamId: string; target: ProbeTarget }> = [];
  const cooldowns = new Cooldowns(
    new Map([...providers.keys()].map((id) => [id, { ...COOLDOWN, ...s.cooldown }])),
    {
      now: () => clock.t,
      probe: {
        probe: async (upstreamId, target) => {
          probes.push({ upstreamId, target });
          return s.probes && upstreamId in s.probes ? s.probes[upstreamId] : "status_5xx";
        },
      },
      onCooledDown: (n) => notices.push(n),
    },
  );
  const members: FailoverMember[] = (
    s.members ?? [...providers.keys()].map((id, i) => ({ id, priority: i, weight: 1 }))
  ).map((m) => ({
    provider: providers.get(m.id)!,
    priority: m.priority ?? 0,
    weight: m.weight ?? 1,
    ...("upstreamModel" in m && m.upstreamModel ? { upstreamModel: m.upstreamModel } : {}),
  }));
  const failover = new FailoverProvider("public-model", members, {
    cooldowns,
    retry: { ...RETRY, ...s.retry },
    deadlineMs: s.deadlineMs ?? 120_000,
    now: () => clock.t,
    random: s.random ?? (() => 0.5),
    sleep: async (ms) => {
      sleeps.push(ms);
      clock.t += ms;
    },
    observer: {
      retry: (model, upstream) => events.push(`retry ${model} ${upstream}`),
      fallback: (model, from, to) => events.push(`fallback ${model} ${from}->${to}`),
    },
  });
  const attemptsAt = (id: string) => providers.get(id)!.attempts.length;
  return { clock, sleeps, notices, events, providers, cooldowns, failover, attemptsAt, probes };
}

const REQ: ProviderRequest = { operation: "chat", body: { model: "m" } };
const signal = () => new AbortController().signal;

async function drain(
  stream: AsyncIterable<ProviderChunk>,
  got: ProviderChunk[] = [],
): Promise<ProviderChunk[]> {
  for await (const c of stream) got.push(c);
  return got;
}

async function rejection(p: Promise<unknown>): Promise<InferenceError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(InferenceError);
  return err as InferenceError;
}

describe("FailoverProvider, buffered", () => {
  it("falls back to the next upstream at once and names the one that served", async () => {
    const { failover, sleeps, events, attemptsAt } = setup({
      upstreams: { a: [{ fail: "status_5xx" }], b: ["ok"] },
    });
    const result = await failover.complete(REQ, signal());
    expect(result.upstreamId).toBe("b");
    expect(result.json).toEqual({ answer: "b" });
    expect([attemptsAt("a"), attemptsAt("b")]).toEqual([1, 1]);
    expect(sleeps).toEqual([]);
    expect(events).toEqual(["retry public-model b", "fallback public-model a->b"]);
  });

  it("sends each upstream the model id it expects", async () => {
    const { failover, providers } = setup({
      upstreams: { a: [{ fail: "status_5xx" }], b: ["ok"] },
      members: [
        { id: "a", priority: 0 },
        { id: "b", priority: 1, upstreamModel: "vendor/model-b" },
      ],
    });
    await failover.complete(REQ, signal());
    expect(providers.get("a")!.attempts.map((r) => r.body.model)).toEqual(["m"]);
    expect(providers.get("b")!.attempts.map((r) => r.body.model)).toEqual(["vendor/model-b"]);
  });

  it.each<AttemptFailure>([
    "connect_error",
    "timeout",
    "status_429",
    "status_5xx",
    "status_auth",
    "interrupted",
  ])("retries after %s", async (kind) => {
    const { failover, attemptsAt } = setup({ upstreams: { a: [{ fail: kind }], b: ["ok"] } });
    expect((await failover.complete(REQ, signal())).upstreamId).toBe("b");
    expect(attemptsAt("b")).toBe(1);
  });

  it.each<AttemptFailure>(["status_4xx", "idle_timeout", "total_timeout"])(
    "does not retry after %s",
    async (kind) => {
      const { failover, attemptsAt } = setup({ upstreams: { a: [{ fail: kind }], b: ["ok"] } });
      expect((await rejection(failover.complete(REQ, signal()))).upstream?.kind).toBe(kind);
      expect(attemptsAt("b")).toBe(0);
    },
  );

  it("retries one upstream with full-jitter exponential backoff, up to maxAttempts", async () => {
    const { failover, sleeps, attemptsAt } = setup({
      upstreams: { a: [{ fail: "status_5xx" }, { fail: "status_5xx" }, { fail: "status_5xx" }] },
      retry: { maxAttempts: 3 },
      random: () => 0.5,
    });
    expect((await rejection(failover.complete(REQ, signal()))).upstream?.kind).toBe("status_5xx");
    expect(attemptsAt("a")).toBe(3);
    // random × min(maxBackoff, base × 2^n): 0.5 × 100, then 0.5 × 200.
    expect(sleeps).toEqual([50, 100]);
  });

  it("keeps every backoff within [0, min(maxBackoffMs, baseBackoffMs × 2^n))", async () => {
    const { failover, sleeps } = setup({
      upstreams: { a: Array.from({ length: 6 }, () => ({ fail: "status_5xx" as const })) },
      retry: { maxAttempts: 6, baseBackoffMs: 100, maxBackoffMs: 250 },
      cooldown: { failures: 100 },
      random: () => 0.999,
    });
    await rejection(failover.complete(REQ, signal()));
    const caps = [100, 200, 250, 250, 250];
    expect(sleeps).toHaveLength(caps.length);
    sleeps.forEach((ms, i) => {
      expect(ms).toBeGreaterThanOrEqual(0);
      expect(ms).toBeLessThan(caps[i]!);
      expect(ms).toBeGreaterThan(caps[i]! * 0.99);
    });
  });

  it("never sleeps or starts an attempt past the request's deadline, and tells each attempt its time left", async () => {
    const { failover, sleeps, providers, clock } = setup({
      upstreams: { a: [{ fail: "timeout", takesMs: 900 }, { fail: "timeout", takesMs: 50 }, "ok"] },
      retry: { maxAttempts: 5, baseBackoffMs: 100 },
      deadlineMs: 1_000,
      random: () => 0.5,
    });
    const started = clock.t;
    await rejection(failover.complete(REQ, signal()));
    const attempts = providers.get("a")!.attempts;
    // 900 ms, a 50 ms backoff, 50 ms: the next backoff (100 ms) would end at the deadline.
    expect(attempts).toHaveLength(2);
    expect(sleeps).toEqual([50]);
    expect(attempts[0]!.timeLeftMs).toBe(1_000);
    expect(attempts[1]!.timeLeftMs).toBe(50);
    expect(clock.t - started).toBeLessThanOrEqual(1_000);
  });

  it("does not retry once the caller went away", async () => {
    const controller = new AbortController();
    const { failover, attemptsAt, cooldowns } = setup({
      upstreams: { a: [{ fail: "connect_error" }], b: ["ok"] },
    });
    controller.abort();
    await rejection(failover.complete(REQ, controller.signal));
    expect(attemptsAt("b")).toBe(0);
    expect(cooldowns.isCooledDown("a")).toBe(false);
  });
});

describe("FailoverProvider, streamed", () => {
  it("retries a stream that failed before its first chunk, and names the upstream on every chunk", async () => {
    const { failover, attemptsAt } = setup({ upstreams: { a: [{ fail: "status_5xx" }], b: ["ok"] } });
    const chunks = await drain(failover.stream(REQ, signal()));
    expect(chunks).toHaveLength(CHUNKS);
    expect(chunks.every((c) => c.upstreamId === "b" && c.json.from === "b")).toBe(true);
    expect([attemptsAt("a"), attemptsAt("b")]).toEqual([1, 1]);
  });

  it("retries a stream broken before any chunk, but never one broken after a chunk", async () => {
    const early = setup({ upstreams: { a: [{ fail: "interrupted", afterChunks: 0 }], b: ["ok"] } });
    expect(await drain(early.failover.stream(REQ, signal()))).toHaveLength(CHUNKS);

    const late = setup({ upstreams: { a: [{ fail: "interrupted", afterChunks: 1 }], b: ["ok"] } });
    const got: ProviderChunk[] = [];
    const err = await rejection(drain(late.failover.stream(REQ, signal()), got));
    expect(err.upstream?.kind).toBe("interrupted");
    expect(got.map((c) => c.upstreamId)).toEqual(["a"]);
    expect(late.attemptsAt("b")).toBe(0);
  });

  it("counts a failure after the first chunk towards the cooldown", async () => {
    const { failover, cooldowns } = setup({
      upstreams: { a: Array.from({ length: 3 }, () => ({ fail: "interrupted" as const, afterChunks: 2 })) },
    });
    for (let i = 0; i < 3; i++) await rejection(drain(failover.stream(REQ, signal())));
    expect(cooldowns.isCooledDown("a")).toBe(true);
  });
});

describe("cooldowns in the failover", () => {
  it("skips a cooled-down upstream without calling it", async () => {
    const { failover, cooldowns, attemptsAt } = setup({ upstreams: { a: ["ok"], b: ["ok"] } });
    cooldowns.apply({ upstreamId: "a", durationMs: 5_000, reason: "failures" });
    expect((await failover.complete(REQ, signal())).upstreamId).toBe("b");
    expect(attemptsAt("a")).toBe(0);
  });

  it("cools an upstream down after `failures` failures, then stops calling it", async () => {
    const { failover, cooldowns, notices, attemptsAt } = setup({
      upstreams: { bad: Array.from({ length: 10 }, () => ({ fail: "status_5xx" as const })), good: [] },
      cooldown: { failures: 3 },
    });
    for (let i = 0; i < 10; i++) expect((await failover.complete(REQ, signal())).upstreamId).toBe("good");
    expect(attemptsAt("bad")).toBe(3);
    expect(cooldowns.isCooledDown("bad")).toBe(true);
    expect(notices).toEqual([{ upstreamId: "bad", durationMs: 30_000, reason: "failures" }]);
  });

  it("cools an upstream down for its Retry-After, bounded by maxRetryAfterMs", async () => {
    const { failover, cooldowns, notices, clock } = setup({
      upstreams: { a: [{ fail: "status_429", retryAfterMs: 5_000 }], b: ["ok", "ok"] },
    });
    await failover.complete(REQ, signal());
    expect(notices).toEqual([{ upstreamId: "a", durationMs: 5_000, reason: "retry_after" }]);
    expect(cooldowns.cooledDownUntil("a")).toBe(clock.t + 5_000);

    const capped = setup({ upstreams: { a: [{ fail: "status_5xx", retryAfterMs: 3_600_000 }], b: ["ok"] } });
    await capped.failover.complete(REQ, signal());
    expect(capped.notices[0]?.durationMs).toBe(60_000);
  });

  it("waits for a Retry-After shorter than a backoff when it is the only upstream, within the deadline", async () => {
    const { failover, sleeps, attemptsAt } = setup({
      upstreams: { a: [{ fail: "status_429", retryAfterMs: 1_000 }, "ok"] },
    });
    expect((await failover.complete(REQ, signal())).upstreamId).toBe("a");
    expect(sleeps).toEqual([1_000]);
    expect(attemptsAt("a")).toBe(2);

    const long = setup({ upstreams: { a: [{ fail: "status_429", retryAfterMs: 10_000 }, "ok"] } });
    expect((await rejection(long.failover.complete(REQ, signal()))).upstream?.kind).toBe("status_429");
    expect(long.sleeps).toEqual([]);
    const late = setup({
      upstreams: { a: [{ fail: "status_429", retryAfterMs: 1_000 }, "ok"] },
      deadlineMs: 900,
    });
    await rejection(late.failover.complete(REQ, signal()));
    expect(late.sleeps).toEqual([]);
  });

  it("answers upstream_error at once when every upstream is cooled down", async () => {
    const { failover, cooldowns, attemptsAt } = setup({ upstreams: { a: ["ok"], b: ["ok"] } });
    cooldowns.apply({ upstreamId: "a", durationMs: 30_000, reason: "failures" });
    cooldowns.apply({ upstreamId: "b", durationMs: 12_000, reason: "failures" });
    const err = await rejection(failover.complete(REQ, signal()));
    expect(err.code).toBe("upstream_error");
    // The caller hears when the first upstream comes back (Retry-After at api-edge).
    expect(err.retryAfterMs).toBe(12_000);
    expect(attemptsAt("a") + attemptsAt("b")).toBe(0);
    expect(await rejection(drain(failover.stream(REQ, signal())))).toMatchObject({ code: "upstream_error" });
  });
});

describe("cooldowns and one caller's poisonous requests", () => {
  /** Lets the breaker take a settled probe's verdict. */
  const settled = () => new Promise<void>((resolve) => setImmediate(resolve));
  const poison = (n: number): Step[] => Array.from({ length: n }, () => ({ fail: "status_5xx" as const }));

  it("content that makes the upstream answer 500 does not take it away from the next caller when its probe answers", async () => {
    // "only" serves the model alone; its scripted answers are the poisonous requests' 500s, then
    // the next caller's ordinary request.
    const { failover, cooldowns, notices, probes, attemptsAt } = setup({
      upstreams: { only: [...poison(6), "ok"] },
      probes: { only: undefined },
      cooldown: { failures: 3 },
    });
    for (let i = 0; i < 2; i++) {
      // Three attempts each (maxAttempts 3), every one answered 500.
      expect((await rejection(failover.complete(REQ, signal()))).upstream?.kind).toBe("status_5xx");
      await settled();
    }
    expect(attemptsAt("only")).toBe(6);
    expect(probes).toEqual([
      { upstreamId: "only", target: { operation: "chat", model: "m" } },
      { upstreamId: "only", target: { operation: "chat", model: "m" } },
    ]);
    expect(cooldowns.isCooledDown("only")).toBe(false);
    expect(notices).toEqual([]);
    const next = await failover.complete(REQ, signal());
    expect(next.upstreamId).toBe("only");
    expect(next.json).toEqual({ answer: "only" });
  });

  it("probes with the model id the failing upstream expects, on the failing route", async () => {
    const { failover, probes } = setup({
      upstreams: { a: poison(3), b: [] },
      members: [
        { id: "a", priority: 0, upstreamModel: "vendor/a" },
        { id: "b", priority: 1 },
      ],
      cooldown: { failures: 3 },
      retry: { maxAttempts: 1 },
    });
    await rejection(failover.complete(REQ, signal()));
    await rejection(drain(failover.stream({ ...REQ, operation: "text" }, signal())));
    await rejection(failover.complete(REQ, signal()));
    expect(probes).toEqual([{ upstreamId: "a", target: { operation: "chat", model: "vendor/a" } }]);
  });

  it("cools a dead upstream down once its probe fails too, then stops calling it", async () => {
    const { failover, cooldowns, notices, probes, attemptsAt } = setup({
      upstreams: { dead: poison(10), good: [] },
      cooldown: { failures: 3 },
    });
    for (let i = 0; i < 10; i++) {
      expect((await failover.complete(REQ, signal())).upstreamId).toBe("good");
      await settled();
    }
    expect(attemptsAt("dead")).toBe(3);
    expect(probes.map((p) => p.upstreamId)).toEqual(["dead"]);
    expect(cooldowns.isCooledDown("dead")).toBe(true);
    expect(notices).toEqual([{ upstreamId: "dead", durationMs: 30_000, reason: "failures" }]);
  });

  it("cools an upstream that refuses connections down at once, without a probe", async () => {
    const { failover, cooldowns, probes, attemptsAt } = setup({
      upstreams: { down: Array.from({ length: 3 }, () => ({ fail: "connect_error" as const })), good: [] },
      cooldown: { failures: 3 },
    });
    for (let i = 0; i < 5; i++) expect((await failover.complete(REQ, signal())).upstreamId).toBe("good");
    expect(attemptsAt("down")).toBe(3);
    expect(cooldowns.isCooledDown("down")).toBe(true);
    expect(probes).toEqual([]);
  });

  it("does not cool an upstream down for streams one caller's content breaks mid-way when its probe answers", async () => {
    const { failover, cooldowns, probes } = setup({
      upstreams: {
        a: [...Array.from({ length: 3 }, () => ({ fail: "interrupted" as const, afterChunks: 1 })), "ok"],
      },
      probes: { a: undefined },
    });
    for (let i = 0; i < 3; i++) await rejection(drain(failover.stream(REQ, signal())));
    await settled();
    expect(probes).toHaveLength(1);
    expect(cooldowns.isCooledDown("a")).toBe(false);
    expect(await drain(failover.stream(REQ, signal()))).toHaveLength(CHUNKS);
  });
});

describe("order", () => {
  /** A small seeded generator, so the weighted draw is the same on every run. */
  function seeded(seed: number): () => number {
    let x = seed;
    return () => {
      x = (Math.imul(x, 1_103_515_245) + 12_345) >>> 0;
      return x / 2 ** 32;
    };
  }
  const member = (id: string, priority: number, weight: number): FailoverMember => ({
    provider: { id } as Provider,
    priority,
    weight,
  });

  it("puts lower priorities first whatever their weights", () => {
    const members = [member("backup", 1, 100), member("main", 0, 1)];
    for (const r of [0, 0.5, 0.99])
      expect(order(members, () => r).map((m) => m.provider.id)).toEqual(["main", "backup"]);
  });

  it("picks first among equal priorities in proportion to weight, keeping every member", () => {
    const members = [member("heavy", 0, 3), member("light", 0, 1), member("later", 1, 1)];
    const random = seeded(42);
    let heavyFirst = 0;
    const draws = 4_000;
    for (let i = 0; i < draws; i++) {
      const ids = order(members, random).map((m) => m.provider.id);
      expect([...ids].sort()).toEqual(["heavy", "later", "light"]);
      expect(ids[2]).toBe("later");
      if (ids[0] === "heavy") heavyFirst++;
    }
    expect(heavyFirst / draws).toBeGreaterThan(0.72);
    expect(heavyFirst / draws).toBeLessThan(0.78);
  });
});
