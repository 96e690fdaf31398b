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
