import type { CooldownConfig } from "@tollgate/config";
import type { CooldownNotice } from "./ports.js";

interface UpstreamState {
  /** Times of the failures inside the current window, oldest first. */
  failures: number[];
  /** Skipped until then (clock ms); 0 when not cooled down. */
  until: number;
  /** A cooldown just ended: the next failure starts another one at once. */
  probation: boolean;
}

/**
 * The circuit breaker of every upstream, as one router replica sees it (issue 8): failures
 * within a window cool an upstream down; a Retry-After cools it down for that long; cooldowns
 * other replicas decided arrive through apply(). Pure: the clock is injected, and a decision
 * taken here is reported to `onCooledDown` (which broadcasts it and counts it).
 */
export class Cooldowns {
  readonly #state = new Map<string, UpstreamState>();

  constructor(
    private readonly policies: ReadonlyMap<string, CooldownConfig>,
    private readonly now: () => number,
    private readonly onCooledDown: (notice: CooldownNotice) => void = () => {},
  ) {}

  /** The upstream ids this breaker knows. */
  get upstreamIds(): string[] {
    return [...this.policies.keys()];
  }

  /** Whether the upstream is skipped now. */
  isCooledDown(upstreamId: string): boolean {
    return this.#refresh(upstreamId).until > 0;
  }

  /** When the upstream's cooldown ends (clock ms), or undefined when it is not cooled down. */
  cooledDownUntil(upstreamId: string): number | undefined {
    const until = this.#refresh(upstreamId).until;
    return until > 0 ? until : undefined;
  }

  /** The upstream answered: its failure count starts again. */
  success(upstreamId: string): void {
    const s = this.#refresh(upstreamId);
    s.failures = [];
    s.probation = false;
  }

  /**
   * One attempt at the upstream failed. With a Retry-After (ms), the upstream is cooled down for
   * that long, bounded by `maxRetryAfterMs`; otherwise the failure counts towards the threshold.
   * Failures of attempts that ran while it was already cooled down change nothing.
   */
  failure(upstreamId: string, retryAfterMs?: number): void {
    const policy = this.policies.get(upstreamId);
    if (!policy) return;
    const s = this.#refresh(upstreamId);
    if (s.until > 0) return;
    if (retryAfterMs !== undefined && retryAfterMs > 0) {
      this.#open(upstreamId, s, Math.min(retryAfterMs, policy.maxRetryAfterMs), "retry_after");
      return;
    }
    const now = this.now();
    s.failures = s.failures.filter((t) => t > now - policy.windowMs);
    s.failures.push(now);
    if (s.probation || s.failures.length >= policy.failures)
      this.#open(upstreamId, s, policy.durationMs, "failures");
  }

  /** A cooldown another replica decided: skip the upstream for that long from now. */
  apply(notice: CooldownNotice): void {
    if (!this.policies.has(notice.upstreamId) || notice.durationMs <= 0) return;
    const s = this.#refresh(notice.upstreamId);
    s.until = Math.max(s.until, this.now() + notice.durationMs);
    s.failures = [];
    s.probation = false;
  }

  #open(upstreamId: string, s: UpstreamState, durationMs: number, reason: CooldownNotice["reason"]): void {
    s.until = this.now() + durationMs;
    s.failures = [];
    s.probation = false;
    this.onCooledDown({ upstreamId, durationMs, reason });
  }

  /** The upstream's state, with an ended cooldown turned into probation. */
  #refresh(upstreamId: string): UpstreamState {
    let s = this.#state.get(upstreamId);
    if (!s) {
      s = { failures: [], until: 0, probation: false };
      this.#state.set(upstreamId, s);
    }
    if (s.until > 0 && s.until <= this.now()) {
      s.until = 0;
      s.probation = true;
    }
    return s;
  }
}
