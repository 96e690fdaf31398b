import { randomBytes } from "node:crypto";
import type { Hex } from "viem";
import { maxOf } from "./amounts.js";
import type { Chain, ChannelRecord, ChannelStore, Log, OnChainState, SignedVoucher } from "./ports.js";
import { channelTag, safeCause } from "./safe-log.js";

/** What the settlement worker works with. */
export interface SettlementDeps {
  store: ChannelStore;
  chain: Chain;
  log: Log;
  now?: () => number;
  /** How long one replica's lease on a settlement run lasts. */
  lockTtlMs: number;
  /** A closing mark older than this may be taken over (same as Close). */
  staleCloseMs?: number;
}

/** A running settlement worker. */
export interface SettlementWorker {
  /** Runs one pass now (tests, and the timer). */
  runOnce(): Promise<void>;
  /**
   * Stops the timer and waits for a pass in progress to end, at most `withinMs` when given: a
   * pass still waiting for a transaction's receipt then is left (logged); its lock lapses after
   * its lease and a later pass, here or on another replica, reads what the chain settled.
   */
  stop(withinMs?: number): Promise<void>;
}

const LOCK = "settlement";

/**
 * The voucher to settle with: the largest accepted voucher whose cumulative is within the
 * committed spend and above what is settled. escrow.settle pays the payee the voucher amount,
 * so settling the highest voucher would capture authorization that was never spent; the
 * unused rest of the deposit goes back to the payer at close (docs/contract.md, "Payment sessions", rule 5).
 */
export function settleableVoucher(vouchers: readonly SignedVoucher[], spent: bigint, settled: bigint) {
  let best: SignedVoucher | undefined;
  for (const v of vouchers) {
    if (v.signature === "0x" || v.cumulative > spent || v.cumulative <= settled) continue;
    if (!best || v.cumulative > best.cumulative) best = v;
  }
  return best;
}

/**
 * Settles channels whose committed spend exceeds what is settled on chain, one replica at a
 * time (a lease in the store). A channel whose payer requested a forced close is closed by the
 * payee within the grace period, capturing exactly the spend, so it is never lost to withdraw.
 */
export function createSettlementWorker(deps: SettlementDeps, intervalMs: number): SettlementWorker {
  const { store, chain, log } = deps;
  const now = deps.now ?? Date.now;
  const staleCloseMs = deps.staleCloseMs ?? 120_000;
  const owner = randomBytes(8).toString("hex");
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let pass: Promise<void> | undefined;

  async function closeForced(record: ChannelRecord, state: OnChainState): Promise<void> {
    const tag = channelTag(record.channelId);
    const begun = await store.beginClose(record.channelId, now(), staleCloseMs);
    if (begun.kind !== "ok") return;
    const current = begun.record;
    const capture = maxOf(maxOf(current.spent, current.settled), state.settled);
    const voucher = current.highest;
    if (voucher.signature === "0x" || voucher.cumulative < capture || capture > state.deposit) {
      await store.abortClose(record.channelId, begun.token);
      log.warn({ channel: tag }, "forced close pending but no voucher covers the spend");
      return;
    }
    try {
      const closed = await chain.close(current.descriptor, record.channelId, voucher, capture);
      await store.finishClose(record.channelId, {
        txHash: closed.txHash,
        cumulative: voucher.cumulative,
        captured: closed.settledToPayee,
      });
      await store.clearDirty(record.channelId);
      log.info({ channel: tag }, "channel closed during its forced-close grace period");
    } catch (err) {
      await store.abortClose(record.channelId, begun.token);
      throw err;
    }
  }

  async function settleChannel(channelId: Hex): Promise<void> {
    const record = await store.get(channelId);
    if (!record || record.status === "closed") {
      await store.clearDirty(channelId);
      return;
    }
    if (record.status !== "open") return;
    const state = await chain.state(channelId);
    if (state.deposit === 0n) {
      log.warn({ channel: channelTag(channelId) }, "channel finalized on chain without this service");
      await store.clearDirty(channelId);
      return;
    }
    const settled = maxOf(record.settled, state.settled);
    if (settled > record.settled) await store.recordSettled(channelId, settled);
    if (state.closeRequestedAt !== 0) {
      await closeForced(record, state);
      return;
    }
    if (record.spent <= settled) {
      await store.clearDirty(channelId);
      return;
    }
    const voucher = settleableVoucher(await store.vouchers(channelId), record.spent, settled);
    // Nothing to do until the spend reaches an accepted voucher; close captures the rest.
    if (!voucher) return;
    const result = await chain.settle(record.descriptor, channelId, voucher);
    await store.recordSettled(channelId, result.settled);
    log.info({ channel: channelTag(channelId) }, "channel settled");
    if (result.settled >= record.spent) await store.clearDirty(channelId);
  }

  async function runOnce(): Promise<void> {
    if (!chain.canSend) return;
    if (!(await store.tryLock(LOCK, owner, deps.lockTtlMs))) return;
    try {
      // Leave half the lease as margin, so another replica never starts while this one works.
      const deadline = now() + deps.lockTtlMs / 2;
      for (const channelId of await store.dirty()) {
        if (stopped || now() > deadline) break;
        try {
          await settleChannel(channelId);
        } catch (err) {
          log.warn({ channel: channelTag(channelId), cause: safeCause(err) }, "settlement failed");
        }
      }
    } finally {
      await store.unlock(LOCK, owner).catch(() => undefined);
    }
  }

  const schedule = () => {
    if (stopped || intervalMs <= 0) return;
    timer = setTimeout(() => {
      pass = runOnce()
        .catch((err: unknown) => log.warn({ cause: safeCause(err) }, "settlement pass failed"))
        .finally(() => {
          pass = undefined;
          schedule();
        });
    }, intervalMs);
    timer.unref();
  };
  schedule();

  return {
    runOnce,
    async stop(withinMs?: number) {
      stopped = true;
      if (timer) clearTimeout(timer);
      const running = pass;
      if (running === undefined) return;
      if (withinMs === undefined) return running;
      let late: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        running.then(() => true),
        new Promise<false>((r) => {
          late = setTimeout(() => r(false), withinMs);
        }),
      ]);
      clearTimeout(late);
      if (!ended)
        log.warn({ waitedMs: withinMs }, "settlement pass still running at stop: left to a later pass");
    },
  };
}
