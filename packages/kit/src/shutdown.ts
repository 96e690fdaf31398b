import type { Logger } from "pino";

/** Something that can be stopped during shutdown. */
export interface Stoppable {
  stop(): Promise<void>;
}

/**
 * Stops `app` on SIGTERM or SIGINT, then exits. The app's own stop() runs the ordered
 * sequence (not ready → stop accepting → drain in-flight → drain NATS → quit Redis); this
 * only bounds it in time so a stuck dependency cannot keep a pod alive forever.
 */
export function onShutdown(app: Stoppable, log: Logger, timeoutMs = 25_000): void {
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
    app.stop().then(
      () => {
        log.info("stopped");
        log.flush?.();
        process.exit(0);
      },
      (err: unknown) => {
        log.error({ err }, "shutdown failed");
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
