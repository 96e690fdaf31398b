import { createLogger } from "@tollgate/kit/log";
import { captureLogs } from "@tollgate/testkit/logs";
import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { newChannel } from "../../test/channel-store-contract.js";
import { FakeChain, UNIT } from "../../test/support.js";
import { createMemoryChannelStore } from "../adapters/memory-channel-store.js";
import { createSettlementWorker, settleableVoucher } from "./settlement.js";

const log = createLogger({ service: "mpp-payment", level: "silent" });
const sig = (n: number) => `0x${n.toString(16).padStart(130, "0")}` as Hex;

describe("settleableVoucher", () => {
  it("picks the largest voucher within the spend and above what is settled", () => {
    const vouchers = [1n, 2n, 3n].map((u, i) => ({ cumulative: u * UNIT, signature: sig(i + 1) }));
    expect(settleableVoucher(vouchers, 2_500_000n, 0n)?.cumulative).toBe(2n * UNIT);
    expect(settleableVoucher(vouchers, 3n * UNIT, 0n)?.cumulative).toBe(3n * UNIT);
    expect(settleableVoucher(vouchers, 999_999n, 0n)).toBeUndefined();
    expect(settleableVoucher(vouchers, 2_500_000n, 2n * UNIT)).toBeUndefined();
    expect(settleableVoucher([{ cumulative: UNIT, signature: "0x" }], 2n * UNIT, 0n)).toBeUndefined();
  });
});

describe("settlement worker", () => {
  async function channelWithSpend(spent: bigint) {
    const store = createMemoryChannelStore();
    const chain = new FakeChain();
    const c = newChannel(UNIT);
    await store.create(c);
    for (const u of [2n, 3n])
      await store.offerVoucher(c.channelId, {
        cumulative: u * UNIT,
        signature: sig(Number(u)),
        checked: true,
        chainDeposit: 0n,
        chainSettled: 0n,
      });
    let left = spent;
    for (let i = 0; left > 0n; i++) {
      const part = left > UNIT ? UNIT : left;
      await store.reserve(c.channelId, `r${i}`, part, 0, Number.MAX_SAFE_INTEGER);
      await store.commit(c.channelId, `r${i}`, part, 0);
      left -= part;
    }
    await store.markDirty(c.channelId);
    chain.states.set(c.channelId, { deposit: 5n * UNIT, settled: 0n, closeRequestedAt: 0 });
    return { store, chain, channelId: c.channelId };
  }

  it("settles with the largest voucher within the spend, never more", async () => {
    const { store, chain, channelId } = await channelWithSpend(2_500_000n);
    const worker = createSettlementWorker({ store, chain, log, lockTtlMs: 60_000 }, 0);
    await worker.runOnce();
    expect(chain.states.get(channelId)?.settled).toBe(2n * UNIT);
    expect((await store.get(channelId))?.settled).toBe(2n * UNIT);
    expect(await store.dirty()).toContain(channelId);
    // Nothing new to settle: no second transaction.
    await worker.runOnce();
    expect(chain.calls.filter((c) => c === "settle")).toHaveLength(1);
    await worker.stop();
  });

  it("closes a channel whose payer requested a forced close, capturing exactly the spend", async () => {
    const { store, chain, channelId } = await channelWithSpend(2_500_000n);
    chain.states.set(channelId, { deposit: 5n * UNIT, settled: 0n, closeRequestedAt: 1_700_000_000 });
    const worker = createSettlementWorker({ store, chain, log, lockTtlMs: 60_000 }, 0);
    await worker.runOnce();
    expect(await store.get(channelId)).toMatchObject({
      status: "closed",
      closed: { captured: 2_500_000n, cumulative: 3n * UNIT },
    });
    expect(await store.dirty()).not.toContain(channelId);
  });

  it("runs on one replica at a time and not at all without a payee key", async () => {
    const { store, chain, channelId } = await channelWithSpend(2n * UNIT);
    expect(await store.tryLock("settlement", "someone-else", 60_000)).toBe(true);
    const worker = createSettlementWorker({ store, chain, log, lockTtlMs: 60_000 }, 0);
    await worker.runOnce();
    expect(chain.calls).not.toContain("settle");
    await store.unlock("settlement", "someone-else");
    chain.canSend = false;
    await worker.runOnce();
    expect(chain.calls).not.toContain("settle");
    chain.canSend = true;
    await worker.runOnce();
    expect(chain.states.get(channelId)?.settled).toBe(2n * UNIT);
    expect(await store.dirty()).not.toContain(channelId);
  });

  it("passes on its own timer and stops cleanly", async () => {
    const { store, chain, channelId } = await channelWithSpend(2n * UNIT);
    const worker = createSettlementWorker({ store, chain, log, lockTtlMs: 60_000 }, 20);
    await expect.poll(() => chain.states.get(channelId)?.settled, { timeout: 2_000 }).toBe(2n * UNIT);
    await worker.stop();
  });

  it("stops within the time it is given while a pass waits for a settlement receipt, and says it left the pass", async () => {
    const { store, chain, channelId } = await channelWithSpend(2n * UNIT);
    const logs = captureLogs();
    const warnLog = createLogger({ service: "mpp-payment", level: "warn", destination: logs.stream });
    // The settle transaction goes out, and its receipt does not come back while the worker stops.
    let receipt!: () => void;
    const receiptBack = new Promise<void>((r) => {
      receipt = r;
    });
    const settle = chain.settle.bind(chain);
    let sent!: () => void;
    const settleSent = new Promise<void>((r) => {
      sent = r;
    });
    chain.settle = async (d, id, v) => {
      const done = await settle(d, id, v);
      sent();
      await receiptBack;
      return done;
    };
    const worker = createSettlementWorker({ store, chain, log: warnLog, lockTtlMs: 60_000 }, 10);
    await settleSent;
    const began = Date.now();
    await worker.stop(300);
    expect(Date.now() - began).toBeLessThan(2_000);
    expect(logs.records().map((r) => r["msg"])).toContain(
      "settlement pass still running at stop: left to a later pass",
    );
    // The stop left the pass: it records the settlement if its receipt comes before the process
    // exits; if not, a later pass reads the chain's settled figure (settleChannel).
    receipt();
    await expect.poll(async () => (await store.get(channelId))?.settled, { timeout: 2_000 }).toBe(2n * UNIT);
    expect(chain.calls.filter((c) => c === "settle")).toHaveLength(1);
  });
});
