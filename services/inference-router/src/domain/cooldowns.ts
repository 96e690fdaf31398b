import type { CooldownConfig } from "@tollgate/config";
import type { AttemptFailure, UpstreamFailure } from "./errors.js";
import type { CooldownNotice, ProbeTarget, UpstreamProbe } from "./ports.js";

/**
 * What one failed attempt does to its upstream's breaker, by how it failed:
 * - `none`: nothing: the upstream refused the request itself (a 4xx), which is the caller's to fix;
 * - `probed`: it counts, but reaching the threshold cools the upstream down only when a probe of
 *   it fails too, because one caller's input alone can cause it again and again (a prompt that
 *   makes the model server answer 500, think past a timeout or break its stream; a request too
 *   large for the upstream's per-minute quota answered 429);
 * - `certain`: it counts and reaching the threshold cools the upstream down at once: no caller
 *   input can cause it (no connection could be opened; the upstream refused the gateway's key).
 * A probe fails when it fails in a way that counts.
 */
const COUNTS = {
  status_4xx: "none",
  timeout: "probed",
  idle_timeout: "probed",
  total_timeout: "probed",
  status_429: "probed",
  status_5xx: "probed",
  interrupted: "probed",
  connect_error: "certain",
  status_auth: "certain",
} as const satisfies Record<AttemptFailure, "none" | "probed" | "certain">;

/** How a probe ended: the upstream answered it, or failed it too. */
export type ProbeResult = "ok" | "failed";

/** A probe that ended, for metrics and logs. */
export interface ProbeNotice {
  upstreamId: string;
  result: ProbeResult;
  /** How the probe failed, when it did. */
  failure?: AttemptFailure;
}

/** What the breaker needs besides its policies. */
export interface CooldownDeps {
  now: () => number;
  probe: UpstreamProbe;
  /** A cooldown decided here (the caller broadcasts it and counts it). */
  onCooledDown?: (notice: CooldownNotice) => void;
  /** A probe ended (the caller counts it). */
  onProbed?: (notice: ProbeNotice) => void;
}

interface UpstreamState {
  /** The failures inside the current window, oldest first: when, and whether a probe must confirm them. */
  failures: Array<{ at: number; probed: boolean }>;
  /** Skipped until then (clock ms); 0 when not cooled down. */
  until: number;
  /** A cooldown just ended: the next failure starts another one at once (after a probe, if it calls for one). */
  probation: boolean;
  /** The probe under way, if any; stale once anything else was decided about the upstream meanwhile. */
  probe: { stale: boolean } | undefined;
}

/**
 * The circuit breaker of every upstream, as one router replica sees it: failures within a window
 * cool an upstream down, after a probe when a caller's input could have caused them; a
 * Retry-After cools it down for that long; cooldowns other replicas decided arrive through
 * apply(). docs/runbooks/inference-router.md ("Retries, fallback and cooldowns") says when.
 * Pure: the clock and the probe are ports, and a decision taken here is reported to
 * `onCooledDown` (which broadcasts it and counts it).
 */
export class Cooldowns {
  readonly #state = new Map<string, UpstreamState>();

  constructor(
    private readonly policies: ReadonlyMap<string, CooldownConfig>,
    private readonly deps: CooldownDeps,
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
    this.#settle(s);
  }

  /**
   * One attempt at the upstream failed (`target`: what it asked, for a probe). With a Retry-After
   * (ms), the upstream is cooled down for that long, bounded by `maxRetryAfterMs`; otherwise the
   * failure counts towards the threshold as COUNTS says. Reaching it (or any counted failure in
   * probation) cools the upstream down at once when every failure in the window is `certain`;
   * otherwise it starts a probe, unless one is under way, and only a failed probe cools it down.
   * Failures of attempts that ran while it was already cooled down change nothing.
   */
  failure(upstreamId: string, failure: UpstreamFailure, target: ProbeTarget): void {
    const policy = this.policies.get(upstreamId);
    const counts = COUNTS[failure.kind];
    if (!policy || counts === "none") return;
    const s = this.#refresh(upstreamId);
    if (s.until > 0) return;
    const { retryAfterMs } = failure;
    if (retryAfterMs !== undefined && retryAfterMs > 0) {
      this.#open(upstreamId, s, Math.min(retryAfterMs, policy.maxRetryAfterMs), "retry_after");
      return;
    }
    const now = this.deps.now();
    s.failures = s.failures.filter((f) => f.at > now - policy.windowMs);
    s.failures.push({ at: now, probed: counts === "probed" });
    if (!s.probation && s.failures.length < policy.failures) return;
    if (s.failures.some((f) => f.probed)) this.#probe(upstreamId, s, target);
    else this.#open(upstreamId, s, policy.durationMs, "failures");
  }

  /**
   * A cooldown another replica decided: skip the upstream for that long from now, but never
   * longer than a replica with this policy decides one (its `durationMs`, or `maxRetryAfterMs`
   * for a Retry-After): a notice asking for more, from a misconfigured replica or from whatever
   * else can publish on the bus, cannot take a model down for longer.
   */
  apply(notice: CooldownNotice): void {
    const policy = this.policies.get(notice.upstreamId);
    if (!policy || !(notice.durationMs > 0)) return;
    const longest = Math.max(policy.durationMs, policy.maxRetryAfterMs);
    const s = this.#refresh(notice.upstreamId);
    s.until = Math.max(s.until, this.deps.now() + Math.min(notice.durationMs, longest));
    this.#settle(s);
  }

  /** One probe at a time per upstream; its verdict is taken only if nothing else was decided meanwhile. */
  #probe(upstreamId: string, s: UpstreamState, target: ProbeTarget): void {
    if (s.probe) return;
    const probe = { stale: false };
    s.probe = probe;
    this.deps.probe
      .probe(upstreamId, target)
      .then(
        (kind) =>
          this.#probed(upstreamId, probe, kind === undefined || COUNTS[kind] === "none" ? undefined : kind),
        // The port never rejects; if it did, the upstream was not shown to answer.
        () => this.#probed(upstreamId, probe, "connect_error"),
      )
      // Nobody awaits a probe: an observer that throws (a broadcast on a connection closed at
      // shutdown) must not end the process. The verdict is in the state before they are called.
      .catch(() => {});
  }

  /** A probe ended: answered, the count starts again; failed, the upstream is cooled down. */
  #probed(upstreamId: string, probe: { stale: boolean }, failure: AttemptFailure | undefined): void {
    const s = this.#refresh(upstreamId);
    s.probe = undefined;
    const decides = !probe.stale && s.until === 0;
    if (decides && !failure) this.#settle(s);
    this.deps.onProbed?.({ upstreamId, result: failure ? "failed" : "ok", ...(failure ? { failure } : {}) });
    if (decides && failure) this.#open(upstreamId, s, this.policies.get(upstreamId)!.durationMs, "failures");
  }

  #open(upstreamId: string, s: UpstreamState, durationMs: number, reason: CooldownNotice["reason"]): void {
    s.until = this.deps.now() + durationMs;
    this.#settle(s);
    this.deps.onCooledDown?.({ upstreamId, durationMs, reason });
  }

  /** Something was decided about the upstream: the count, probation and any probe's verdict are done with. */
  #settle(s: UpstreamState): void {
    s.failures = [];
    s.probation = false;
    if (s.probe) s.probe.stale = true;
  }

  /** The upstream's state, with an ended cooldown turned into probation. */
  #refresh(upstreamId: string): UpstreamState {
    let s = this.#state.get(upstreamId);
    if (!s) {
      s = { failures: [], until: 0, probation: false, probe: undefined };
      this.#state.set(upstreamId, s);
    }
    if (s.until > 0 && s.until <= this.deps.now()) {
      s.until = 0;
      s.probation = true;
    }
    return s;
  }
}
