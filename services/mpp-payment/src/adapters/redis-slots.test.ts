import { randomBytes } from "node:crypto";
import { crossSlot, slotRecorder } from "@tollgate/testkit/slots";
import type { Hex } from "viem";
import { describe, expect, it } from "vitest";
import { createRedisChannelStore } from "./redis-channel-store.js";

const hex = (bytes: number) => `0x${randomBytes(bytes).toString("hex")}` as Hex;

describe("mpp-payment's Redis keys on a Redis Cluster: every script stays in one slot", () => {
  it("runs every channel script on random channels", async () => {
    for (let i = 0; i < 200; i++) {
      const channelId = hex(32);
      const { redis, calls } = slotRecorder((name) => {
        if (name === "mppOfferVoucher") return ["accepted", "20", "0", "0", "reserved"];
        if (name === "mppCommit") return ["committed", "1", "10", "1", "0"];
        if (name === "mppBeginClose") return "busy";
        if (name === "mppTryLock" || name === "mppCreateChannel") return 1;
        if (name === "mppReserve") return ["reserved", "0", "5", "0"];
        if (name === "mppRelease") return "released";
        return null;
      });
      const store = createRedisChannelStore(redis, {
        prefix: `tollgate:t_${randomBytes(4).toString("hex")}:`,
      });
      const rid = `r_${randomBytes(8).toString("hex")}`;
      const now = Date.now();
      await store.create({
        channelId,
        descriptor: {
          payer: hex(20),
          payee: hex(20),
          operator: hex(20),
          token: hex(20),
          salt: hex(32),
          authorizedSigner: hex(20),
          expiringNonceHash: hex(32),
        },
        deposit: 100n,
        settled: 0n,
        voucher: { cumulative: 10n, signature: hex(65) },
      });
      const voucher = {
        cumulative: 20n,
        signature: hex(65),
        checked: true,
        chainDeposit: 0n,
        chainSettled: 0n,
      };
      await store.offerVoucher(channelId, voucher);
      await store.raiseDeposit(channelId, 200n);
      const challenge = { id: randomBytes(32).toString("base64url"), until: now + 360_000 };
      await store.reserve(channelId, rid, 5n, now, now + 60_000, challenge);
      await store.offerVoucher(channelId, voucher, {
        reservationId: rid,
        amount: 5n,
        now,
        expiresAt: now + 60_000,
        challenge,
      });
      await store.commit(channelId, rid, 4n, now);
      await store.release(channelId, rid, now);
      await store.beginClose(channelId, now, 60_000);
      await store.abortClose(channelId, now);
      await store.finishClose(channelId, { txHash: hex(32), cumulative: 20n, captured: 20n });
      await store.recordSettled(channelId, 20n);
      await store.tryLock("settle", "me", 1_000);
      await store.unlock("settle", "me");
      expect(calls.filter((c) => c.kind === "script")).toHaveLength(13);
      expect(crossSlot(calls)).toEqual([]);
    }
  });
});
