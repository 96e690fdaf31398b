import { describe, expect, it } from "vitest";
import { channelStoreContract, newChannel } from "../../test/channel-store-contract.js";
import { createMemoryChannelStore } from "./memory-channel-store.js";

describe("memory channel store", () => {
  channelStoreContract(() => createMemoryChannelStore());

  it("forgets finished reservations only after their retention", async () => {
    const store = createMemoryChannelStore({ reservationRetentionMs: 1_000 });
    const c = newChannel();
    await store.create(c);
    await store.reserve(c.channelId, "r1", 5n, 0, 100);
    await store.commit(c.channelId, "r1", 5n, 50);
    // Within retention a commit repeats its answer; afterwards the id is unknown.
    await store.reserve(c.channelId, "other", 1n, 1_049, 1_100);
    expect((await store.commit(c.channelId, "r1", 5n, 1_049)).kind).toBe("committed");
    await store.reserve(c.channelId, "later", 1n, 2_100, 2_200);
    expect((await store.commit(c.channelId, "r1", 5n, 2_100)).kind).toBe("unknown");
  });

  it("keeps no finished reservation much past its retention under sustained load", async () => {
    const store = createMemoryChannelStore();
    const c = newChannel();
    await store.create(c);
    // 30 hours of paid requests, one every 10 s, each committed at once; retention is 24 h.
    const step = 10_000;
    for (let i = 0; i < 10_800; i++) {
      const now = i * step;
      expect((await store.reserve(c.channelId, `r${i}`, 1n, now, now + 1_000)).kind).toBe("reserved");
      expect((await store.commit(c.channelId, `r${i}`, 1n, now)).kind).toBe("committed");
    }
    expect(store.retained().reservations).toBeLessThanOrEqual((24 * 3_600_000 + 60_000) / step + 2);
  });

  it("keeps no used challenge past its time under sustained load", async () => {
    const store = createMemoryChannelStore();
    const channels = [newChannel(), newChannel()];
    for (const c of channels) await store.create(c);
    // 2 hours of paid requests on two channels, one every second, each consuming its challenge
    // (remembered 6 minutes); the second channel goes quiet after the first 10 minutes.
    for (let i = 0; i < 7_200; i++) {
      const now = i * 1_000;
      const active = i < 600 ? channels : channels.slice(0, 1);
      for (const c of active) {
        const challenge = { id: `c${i}`, until: now + 360_000 };
        expect((await store.reserve(c.channelId, `r${i}`, 1n, now, now + 1_000, challenge)).kind).toBe(
          "reserved",
        );
        await store.commit(c.channelId, `r${i}`, 1n, now);
      }
    }
    // The active channel: the last 6 minutes; the quiet one: swept with the finished reservations.
    expect(store.retained().usedChallenges).toBeLessThanOrEqual(360 + 1);
  });

  it("lets a lease lapse after its time to live", async () => {
    let now = 0;
    const store = createMemoryChannelStore({ now: () => now });
    expect(await store.tryLock("l", "a", 1_000)).toBe(true);
    now = 999;
    expect(await store.tryLock("l", "b", 1_000)).toBe(false);
    now = 1_000;
    expect(await store.tryLock("l", "b", 1_000)).toBe(true);
  });
});
