/** How long, and how often, a background retry tries again. */
export interface RetryPolicy {
  /** Pause before each attempt (the first one too). */
  everyMs: number;
  /** No attempt starts later than this after the call. */
  forMs: number;
}

/**
 * Runs `task` again in the background while it fails with an error `transient` accepts (a store
 * or a service briefly away), pausing `everyMs` before each attempt, for at most `forMs`.
 * Resolves true once an attempt succeeded, false when it gave up (a lasting error, or time ran
 * out; `onGiveUp` gets the last error). Its timers never keep the process alive.
 */
export async function retryLater(
  task: () => Promise<unknown>,
  transient: (err: unknown) => boolean,
  policy: RetryPolicy,
  onGiveUp?: (err: unknown) => void,
): Promise<boolean> {
  const deadline = Date.now() + policy.forMs;
  let last: unknown;
  while (Date.now() + policy.everyMs <= deadline) {
    await new Promise((r) => setTimeout(r, policy.everyMs).unref());
    try {
      await task();
      return true;
    } catch (err) {
      last = err;
      if (!transient(err)) break;
    }
  }
  onGiveUp?.(last);
  return false;
}
