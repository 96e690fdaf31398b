import type { Logger } from "pino";
import { shutdownTracing } from "./tracing.js";

/** Something that can be stopped during shutdown. */
export interface Stoppable {
  stop(): Promise<void>;
}

/**
 * Stops `app` on SIGTERM or SIGINT, then exits. The app's own stop() runs the ordered
 * sequence (not ready → stop accepting → drain in-flight → drain NATS → quit Redis); then the
 * spans of the last requests are flushed (when tracing is on). This only bounds it in time
 * (`timeoutMs`, from SHUTDOWN_TIMEOUT_SECONDS: config.ts) so a stuck dependency or collector
 * cannot keep a pod alive forever.
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
    app.stop().then(
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
