import type { RetryConfig } from "@tollgate/config";
import type { Cooldowns } from "./cooldowns.js";
import { type AttemptFailure, InferenceError } from "./errors.js";
import type { Provider, ProviderChunk, ProviderRequest, ProviderResult } from "./ports.js";

/** One upstream serving a model, with its place in the failover order. */
export interface FailoverMember {
  provider: Provider;
  /** Lower first. */
  priority: number;
  /** Share of first attempts among members of the same priority. */
  weight: number;
  /** The model id this upstream expects, when it differs from the model's. */
  upstreamModel?: string;
}

/** Counts the failover decisions (metrics). */
export interface FailoverObserver {
  /** Another attempt of the same request starts on `upstreamId`. */
  retry(model: string, upstreamId: string): void;
  /** That attempt runs on another upstream than the one before. */
  fallback(model: string, from: string, to: string): void;
}

/** What a failover provider needs besides its members. */
export interface FailoverDeps {
  cooldowns: Cooldowns;
  retry: RetryConfig;
  /** The request's deadline, from its start: no attempt or backoff runs past it. */
  deadlineMs: number;
  now: () => number;
  /** Uniform in [0, 1). */
  random: () => number;
  /** Resolves after `ms`, or early when `signal` aborts. */
  sleep: (ms: number, signal: AbortSignal) => Promise<void>;
  observer?: FailoverObserver;
}

/**
 * Failures worth another attempt, when the caller has seen nothing yet (docs/configuration.md, "Upstream
 * failover": a failed attempt costs the caller nothing).
 */
const RETRYABLE = new Set<AttemptFailure>([
  "connect_error",
  "timeout",
  "status_429",
  "status_5xx",
  "status_auth",
  "interrupted",
]);

/**
 * A model's upstreams behind one Provider: each call tries them by priority (weighted random
 * among equal priorities), skipping cooled-down ones, and retries a connection error, a
 * first-byte timeout, a 429, a 5xx or a stream broken before its first chunk, but never once
 * a chunk has been handed on. A different upstream is tried at once; an upstream tried before
 * waits a full-jitter exponential backoff. The answer names the upstream that served it.
 */
export class FailoverProvider implements Provider {
  readonly id: string;
  readonly #members: readonly FailoverMember[];

  constructor(
    /** The public model id, for metrics. */
    private readonly model: string,
    members: readonly FailoverMember[],
    private readonly deps: FailoverDeps,
  ) {
    if (members.length === 0) throw new Error(`model ${model}: no upstream`);
    this.#members = members;
    this.id = members.length === 1 ? members[0]!.provider.id : `failover:${model}`;
  }

  async complete(req: ProviderRequest, signal: AbortSignal): Promise<ProviderResult> {
    const attempts = this.#attempts(signal);
    let last: unknown;
    for (let member = await attempts.next(); member; member = await attempts.next()) {
      const attempt = attempts.request(req, member);
      try {
        const result = await member.provider.complete(attempt, signal);
        this.deps.cooldowns.success(member.provider.id);
        return { ...result, upstreamId: result.upstreamId ?? member.provider.id };
      } catch (err) {
        if (!this.#failed(member, attempt, err, signal)) throw err;
        last = err;
      }
    }
    throw this.#exhausted(last);
  }

  async *stream(req: ProviderRequest, signal: AbortSignal): AsyncGenerator<ProviderChunk> {
    const attempts = this.#attempts(signal);
    let last: unknown;
    for (let member = await attempts.next(); member; member = await attempts.next()) {
      let delivered = false;
      const attempt = attempts.request(req, member);
      try {
        for await (const chunk of member.provider.stream(attempt, signal)) {
          delivered = true;
          yield { ...chunk, upstreamId: chunk.upstreamId ?? member.provider.id };
        }
        // Only a finished stream clears the count: one that keeps dying mid-way cools down too.
        this.deps.cooldowns.success(member.provider.id);
        return;
      } catch (err) {
        // Once a chunk went on, the caller has the start of an answer: no second one.
        if (!this.#failed(member, attempt, err, signal) || delivered) throw err;
        last = err;
      }
    }
    throw this.#exhausted(last);
  }

  /**
   * The error once no attempt is left: the last attempt's, or "every upstream is cooled down";
   * when every upstream is cooled down it carries how long until the first comes back, which
   * the caller gets as Retry-After.
   */
  #exhausted(last: unknown): unknown {
    const err = last ?? allCooledDown(this.model);
    const { cooldowns } = this.deps;
    if (
      !(err instanceof InferenceError) ||
      !this.#members.every((m) => cooldowns.isCooledDown(m.provider.id))
    )
      return err;
    const soonest = Math.min(...this.#members.map((m) => cooldowns.cooledDownUntil(m.provider.id) ?? 0));
    return new InferenceError(err.code, err.message, err.upstream, Math.max(0, soonest - this.deps.now()));
  }

  /**
   * Records a failed attempt with the breaker (which decides whether it counts, and probes the
   * upstream with the attempt's route and model id when it must); true when another attempt may
   * follow.
   */
  #failed(member: FailoverMember, attempt: ProviderRequest, err: unknown, signal: AbortSignal): boolean {
    if (signal.aborted || !(err instanceof InferenceError) || !err.upstream) return false;
    const model = typeof attempt.body.model === "string" ? attempt.body.model : "";
    this.deps.cooldowns.failure(member.provider.id, err.upstream, { operation: attempt.operation, model });
    return RETRYABLE.has(err.upstream.kind);
  }

  #attempts(signal: AbortSignal): Attempts {
    return new Attempts(this.model, order(this.#members, this.deps.random), this.deps, signal);
  }
}

/** The attempts of one request: which upstream next, after which wait, with how much time left. */
class Attempts {
  readonly #deadline: number;
  readonly #tried = new Set<FailoverMember>();
  #count = 0;
  #backoffs = 0;
  #previous: FailoverMember | undefined;

  constructor(
    private readonly model: string,
    private readonly order: readonly FailoverMember[],
    private readonly deps: FailoverDeps,
    private readonly signal: AbortSignal,
  ) {
    this.#deadline = deps.now() + deps.deadlineMs;
  }

  /** The request for the next attempt, with the time left before the deadline. */
  request(req: ProviderRequest, member: FailoverMember): ProviderRequest {
    const timeLeftMs = Math.max(1, this.#deadline - this.deps.now());
    const body = member.upstreamModel ? { ...req.body, model: member.upstreamModel } : req.body;
    return { ...req, body, timeLeftMs };
  }

  /** The member to try next (after any wait), or undefined when no attempt is left. */
  async next(): Promise<FailoverMember | undefined> {
    if (this.#count >= this.deps.retry.maxAttempts || this.signal.aborted) return undefined;
    const { cooldowns } = this.deps;
    const available = this.order.filter((m) => !cooldowns.isCooledDown(m.provider.id));
    // Untried upstreams first, in order; then the ones tried before, again in order.
    let member = available.find((m) => !this.#tried.has(m)) ?? available[0];
    let wait = 0;
    if (!member) {
      // Every upstream is cooled down: wait for the first to come back only when that is no
      // longer than a backoff would be, and before the deadline.
      const soonest = this.order
        .map((m) => ({ m, until: cooldowns.cooledDownUntil(m.provider.id) ?? 0 }))
        .sort((a, b) => a.until - b.until)[0]!;
      wait = soonest.until - this.deps.now();
      if (wait > this.deps.retry.maxBackoffMs) return undefined;
      member = soonest.m;
    } else if (this.#tried.has(member)) {
      const cap = Math.min(this.deps.retry.maxBackoffMs, this.deps.retry.baseBackoffMs * 2 ** this.#backoffs);
      this.#backoffs++;
      wait = this.deps.random() * cap;
    }
    if (this.deps.now() + wait >= this.#deadline) return undefined;
    if (wait > 0) {
      await this.deps.sleep(wait, this.signal);
      if (this.signal.aborted) return undefined;
    }
    if (this.#count > 0) {
      this.deps.observer?.retry(this.model, member.provider.id);
      if (this.#previous && this.#previous !== member)
        this.deps.observer?.fallback(this.model, this.#previous.provider.id, member.provider.id);
    }
    this.#count++;
    this.#tried.add(member);
    this.#previous = member;
    return member;
  }
}

/** Priority ascending; within a priority, a weighted random permutation. */
export function order(members: readonly FailoverMember[], random: () => number): FailoverMember[] {
  const byPriority = new Map<number, FailoverMember[]>();
  for (const m of members) byPriority.set(m.priority, [...(byPriority.get(m.priority) ?? []), m]);
  const out: FailoverMember[] = [];
  for (const priority of [...byPriority.keys()].sort((a, b) => a - b)) {
    const pool = [...byPriority.get(priority)!];
    while (pool.length > 0) {
      const total = pool.reduce((sum, m) => sum + m.weight, 0);
      let r = random() * total;
      let i = 0;
      while (i < pool.length - 1 && r >= pool[i]!.weight) {
        r -= pool[i]!.weight;
        i++;
      }
      out.push(...pool.splice(i, 1));
    }
  }
  return out;
}

function allCooledDown(model: string): InferenceError {
  return new InferenceError("upstream_error", `every upstream of the model '${model}' is cooled down`);
}
