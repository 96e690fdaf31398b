import type { Logger } from "pino";

/** How long, and at what pace, a failing call is tried again. */
export interface RetryPolicy {
  /** Pause before the first retry; it doubles after each, up to `maxDelayMs`. */
  delayMs: number;
  /** Longest pause. Default `delayMs` (a fixed pace). */
  maxDelayMs?: number;
  /** No retry starts later than this after the first attempt. */
  forMs: number;
}

/**
 * Runs `task`, and again after a pause while it fails with an error `transient` accepts (a store,
 * a service or a bus briefly away), for at most `policy.forMs`. Resolves with the first success;
 * rejects with the last error once the error is lasting or the time is up. The pauses never keep
 * the process alive, so a retry left running in the background does not hold up an exit.
 */
export async function retrying<T>(
  task: () => Promise<T>,
  transient: (err: unknown) => boolean,
  policy: RetryPolicy,
): Promise<T> {
  const deadline = Date.now() + policy.forMs;
  const max = policy.maxDelayMs ?? policy.delayMs;
  for (let delay = policy.delayMs; ; delay = Math.min(delay * 2, max)) {
    try {
      return await task();
    } catch (err) {
      if (!transient(err) || Date.now() + delay > deadline) throw err;
      await new Promise((r) => setTimeout(r, delay).unref());
    }
  }
}

/** Every failure is worth another try (the caller bounds them in time). */
export const always = (): boolean => true;

/** Pauses between attempts to reach a dependency at start: doubling from 250 ms, at most 5 s. */
const FIRST_WAIT_MS = 250;
const MAX_WAIT_MS = 5_000;

/**
 * Runs `attempt` until it succeeds, waiting between tries (250 ms doubling to 5 s, without end)
 * while it fails with an error `unreachable` accepts: how a service waits at start for a Redis or
 * NATS that is not there yet, alive, instead of exiting into a restart loop and its backoff. Each
 * failed try logs one warn naming `dependency` (a kind and an address, never a credential); any
 * other error rejects at once. The pauses keep the process alive (nothing else may yet).
 */
export async function untilReachable<T>(
  dependency: string,
  attempt: () => Promise<T>,
  unreachable: (err: unknown) => boolean,
  log: Pick<Logger, "warn">,
): Promise<T> {
  for (let tries = 1, delay = FIRST_WAIT_MS; ; tries++, delay = Math.min(delay * 2, MAX_WAIT_MS)) {
    try {
      return await attempt();
    } catch (err) {
      if (!unreachable(err)) throw err;
      log.warn(
        { dependency, attempt: tries, retryInMs: delay, reason: reasonOf(err) },
        `${dependency} unreachable at start; waiting for it`,
      );
      await new Promise((r) => setTimeout(r, delay));
    }
  }
}

/** An error's own message and its cause's (`connection refused: connect ECONNREFUSED …`). */
function reasonOf(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error ? err.cause.message : undefined;
  return cause && cause !== err.message ? `${err.message}: ${cause}` : err.message;
}
