import { ConfigError } from "./config.js";
import { createLogger, type Logger } from "./log.js";
import { onShutdown, type Stoppable } from "./shutdown.js";
import { releaseStartupMemory } from "./startup-memory.js";
import { initTracing, type TracingOptions } from "./tracing.js";

/** What every service's configuration carries for running it. */
export interface RunnableConfig {
  logLevel: string;
  tracing?: TracingOptions | undefined;
  shutdownTimeoutMs: number;
}

/**
 * An error as one line a person can act on, without a stack: each configuration problem,
 * separated by "; ", or the error's first line.
 */
export function oneLine(err: unknown): string {
  if (err instanceof ConfigError) return `invalid configuration: ${err.problems.join("; ")}`;
  const message = err instanceof Error ? err.message : String(err);
  return message.split("\n")[0]!.trim();
}

/**
 * A service's main: loads its configuration, starts it and stops it on SIGTERM/SIGINT. A
 * configuration that cannot be loaded (bad environment, unreadable or invalid YAML) exits 1 with
 * one line on stderr naming what is wrong; a start that fails exits 1 with one error log line.
 * Neither prints a stack trace. A Redis or NATS not reachable yet is no failure: start() waits
 * for it (kit/retry.ts, untilReachable).
 */
export async function runService<C extends RunnableConfig>(
  service: string,
  load: () => C,
  start: (config: C, log: Logger) => Promise<Stoppable>,
): Promise<void> {
  let config: C;
  try {
    config = load();
  } catch (err) {
    process.stderr.write(`${service}: ${oneLine(err)}\n`);
    process.exit(1);
  }
  const log = createLogger({ service, level: config.logLevel });
  await initTracing(config.tracing, log);
  let app: Stoppable;
  try {
    app = await start(config, log);
  } catch (err) {
    log.fatal({ reason: oneLine(err) }, "could not start");
    process.exit(1);
  }
  onShutdown(app, log, config.shutdownTimeoutMs);
  releaseStartupMemory();
}
