import type { GatewayConfig } from "@tollgate/config";
import type { Logger } from "@tollgate/kit/log";
import type { KeyStore } from "./domain/ports.js";

/** What a store that emits "ready" on every (re)connection looks like: an ioredis client. */
export interface ReadyEmitter {
  on(event: "ready", listener: () => void): unknown;
  off(event: "ready", listener: () => void): unknown;
}

/** Stops the watch (resolves once a check in progress is done); `check()` runs one now. */
export type Reseeding = (() => Promise<void>) & { check(): void };

/** How often a failed check is tried again while the connection stays up. */
const RETRY_MS = 1_000;

/** How much of the configuration a seed loads (counts only; never ids or key material). */
export function seedCounts(cfg: GatewayConfig): { accounts: number; connections: number; keys: number } {
  const connections = cfg.accounts.flatMap((a) => a.connections);
  return {
    accounts: cfg.accounts.length,
    connections: connections.length,
    keys: connections.reduce((n, c) => n + c.keys.length, 0),
  };
}

/**
 * Re-seeds the configuration when the store comes back without it. Each time `connection` is
 * ready again (a reconnect), asks the store whether the seed is still there (its marker, written
 * by the last step of every import); only when it is gone (Redis restarted empty) is `seed`
 * run again, so run-time changes to configured keys, connections and budgets survive a
 * reconnect to a Redis that kept its data. A check that fails is tried again every second until
 * it succeeds or the next reconnect. Returns a function that stops watching and waits for a
 * check in progress, with `check()` to run one now (a key lookup found the marker gone).
 */
export function reseedWhenLost(opts: {
  connection: ReadyEmitter;
  store: KeyStore;
  gateway: GatewayConfig;
  seed: () => Promise<void>;
  log: Logger;
  retryMs?: number;
}): Reseeding {
  const { connection, store, seed, log } = opts;
  let stopped = false;
  let running: Promise<void> | undefined;
  let again = false;
  let retry: NodeJS.Timeout | undefined;

  const checkOnce = async () => {
    if (await store.seeded()) {
      log.info("store connection ready again; its data (the seed marker) is intact");
      return;
    }
    const counts = seedCounts(opts.gateway);
    log.error(
      counts,
      "store lost its data (its seed marker is gone): keys, accounts and connections are unknown until re-seeded; run-time changes, spend and rate-limit counts are gone",
    );
    await seed();
    log.warn(counts, "store lost its data; configuration re-seeded");
  };
  const check = () => {
    if (stopped) return;
    clearTimeout(retry);
    if (running) {
      again = true;
      return;
    }
    running = checkOnce()
      .catch((err: unknown) => {
        log.error({ err }, "checking the store for lost data failed; will retry");
        if (!stopped) retry = setTimeout(check, opts.retryMs ?? RETRY_MS).unref();
      })
      .finally(() => {
        running = undefined;
        if (again) {
          again = false;
          check();
        }
      });
  };
  connection.on("ready", check);
  const stop = async () => {
    stopped = true;
    connection.off("ready", check);
    clearTimeout(retry);
    await running;
  };
  return Object.assign(stop, { check });
}
