import type { Logger } from "pino";
import { shutdownTracing } from "./tracing.js";

/**
 * When a stop's steps must be done by. A step that waits for work it does not own (Commits
 * another service answers, a settlement pass's receipt) waits at most what is left, then logs
 * what it leaves and lets the stop go on: the process exits 0 inside its bound rather than being
 * cut at the bound with exit 1.
 */
export interface StopDeadline {
  /** Milliseconds left (0 once passed). */
  remainingMs(): number;
}

/** A deadline `withinMs` from now. */
export function stopDeadline(withinMs: number, now: () => number = Date.now): StopDeadline {
  const at = now() + withinMs;
  return { remainingMs: () => Math.max(0, at - now()) };
}

/**
 * What a stop bound keeps back from its steps for what follows them (ms): flushing the last
 * spans, the final log lines and the exit. A fifth of the bound when that is less (a bound of
 * 1 s keeps 200 ms).
 */
export const AFTER_STOP_STEPS_MS = 1_000;

/** The deadline of the steps of a stop bounded by `timeoutMs`. */
export function stepsDeadline(timeoutMs: number, now: () => number = Date.now): StopDeadline {
  return stopDeadline(timeoutMs - Math.min(AFTER_STOP_STEPS_MS, timeoutMs / 5), now);
}

/** At most `capMs`, and never past `deadline` when there is one. */
export function withinDeadline(capMs: number, deadline: StopDeadline | undefined): number {
  return deadline === undefined ? capMs : Math.min(capMs, deadline.remainingMs());
}

/** Something that can be stopped during shutdown. */
export interface Stoppable {
  /** Stops; steps that wait for others' work keep within `deadline` when one is given. */
  stop(deadline?: StopDeadline): Promise<void>;
}

/**
 * Stops `app` on SIGTERM or SIGINT, then exits. The app's own stop() runs the ordered
 * sequence (not ready → stop accepting → drain in-flight → drain NATS → quit Redis); then the
 * spans of the last requests are flushed (when tracing is on). This only bounds it in time
 * (`timeoutMs`, from SHUTDOWN_TIMEOUT_SECONDS: config.ts) so a stuck dependency or collector
 * cannot keep a pod alive forever, and hands the app the deadline of its steps (the bound less
 * what follows them: stepsDeadline).
 */
export function onShutdown(app: Stoppable, log: Logger, timeoutMs: number): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "shutting down");
    const timer = setTimeout(() => {
      log.error({ timeoutMs }, "shutdown timed out");
      process.exit(1);
    }, timeoutMs);
    timer.unref();
    app.stop(stepsDeadline(timeoutMs)).then(
      async () => {
        await shutdownTracing(log);
        log.info("stopped");
        log.flush?.();
        process.exit(0);
      },
      async (err: unknown) => {
        log.error({ err }, "shutdown failed");
        await shutdownTracing(log);
        process.exit(1);
      },
    );
  };
  process.once("SIGTERM", handler);
  process.once("SIGINT", handler);
}

/** Runs stop steps in order, continuing past failures, and rethrows the first failure at the end. */
export async function stopInOrder(steps: ReadonlyArray<() => Promise<unknown> | unknown>): Promise<void> {
  let first: unknown;
  for (const step of steps) {
    try {
      await step();
    } catch (err) {
      first ??= err;
    }
  }
  if (first !== undefined) throw first;
}
