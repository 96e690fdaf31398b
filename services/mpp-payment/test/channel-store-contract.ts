import { randomBytes } from "node:crypto";
import { type Hex, keccak256, toHex, zeroAddress } from "viem";
import { expect, it } from "vitest";
import type { ChannelStore, NewChannel, OfferedVoucher, OfferVoucherOutcome } from "../src/domain/ports.js";
import { USDC_E } from "./support.js";

// Real time: the Redis store lets finished reservations expire on the server clock.
const T0 = Date.now();
const TTL = 300_000;

/** A fresh channel whose highest voucher is `highest`, deposit 5 units. */
export function newChannel(highest = 1_000_000n, settled = 0n): NewChannel {
  const payer = toHex(randomBytes(20));
  return {
    channelId: keccak256(randomBytes(32)),
    descriptor: {
      payer,
      payee: toHex(randomBytes(20)),
      operator: zeroAddress,
      token: USDC_E,
      salt: toHex(randomBytes(32)),
      authorizedSigner: payer,
      expiringNonceHash: keccak256(randomBytes(32)),
    },
    deposit: 5_000_000n,
    settled,
    voucher: { cumulative: highest, signature: toHex(randomBytes(65)) },
  };
}

const sig = () => toHex(randomBytes(65)) as Hex;

/** A voucher offered with its signature verified, the chain showing what the store holds. */
const checked = (cumulative: bigint, chain: Partial<OfferedVoucher> = {}): OfferedVoucher => ({
  cumulative,
  signature: sig(),
  checked: true,
  chainDeposit: 0n,
  chainSettled: 0n,
  ...chain,
});
/** The channel's accepted voucher, offered without a verified signature. */
const unchecked = (v: { cumulative: bigint; signature: Hex }): OfferedVoucher => ({
  ...v,
  checked: false,
  chainDeposit: 0n,
  chainSettled: 0n,
});
/** What the hold of an offer answered. */
const heldOf = (o: OfferVoucherOutcome) => ("held" in o ? o.held : undefined);
const hold = (reservationId: string, amount: bigint, now = T0) => ({
  reservationId,
  amount,
  now,
  expiresAt: now + TTL,
});

/**
 * Behaviour every ChannelStore must show; the memory store runs it as a unit test and the
 * Redis store against a real Redis, so the two cannot drift apart.
 */
export function channelStoreContract(makeStore: () => ChannelStore | Promise<ChannelStore>): void {
  it("creates a channel once and reads it back", async () => {
    const store = await makeStore();
    const c = newChannel();
    expect(await store.get(c.channelId)).toBeUndefined();
    expect(await store.create(c)).toBe(true);
    expect(await store.create({ ...c, deposit: 9n })).toBe(false);
    expect(await store.get(c.channelId)).toEqual({
      channelId: c.channelId,
      descriptor: c.descriptor,
      deposit: 5_000_000n,
      settled: 0n,
      highest: c.voucher,
      spent: 0n,
      held: 0n,
      units: 0,
      status: "open",
    });
  });

  it("only raises the accepted voucher: higher is accepted, equal is the same, lower is stale", async () => {
    const store = await makeStore();
    const c = newChannel();
    await store.create(c);
    const higher = checked(2_000_000n);
    const figures = { accepted: 2_000_000n, spent: 0n, units: 0 };
    expect(await store.offerVoucher(c.channelId, higher)).toEqual({ kind: "accepted", ...figures });
    expect(await store.offerVoucher(c.channelId, checked(2_000_000n))).toEqual({ kind: "same", ...figures });
    expect(await store.offerVoucher(c.channelId, checked(1_500_000n))).toEqual({ kind: "stale" });
    expect((await store.get(c.channelId))?.highest).toEqual({
      cumulative: higher.cumulative,
      signature: higher.signature,
    });
    expect(await store.offerVoucher(newChannel().channelId, higher)).toEqual({ kind: "unknown" });
    const vouchers = await store.vouchers(c.channelId);
    expect(vouchers.map((v) => v.cumulative).sort()).toEqual([1_000_000n, 2_000_000n]);
  });

  it("raises only above the settled amount and within the deposit, stored or on chain, and raises the stored deposit", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n, 500_000n);
    await store.create(c);
    expect(await store.offerVoucher(c.channelId, checked(1_200_000n, { chainSettled: 1_200_000n }))).toEqual({
      kind: "settled",
    });
    // Above the stored 5 units, not above what the chain shows: accepted, the stored deposit raised.
    expect(await store.offerVoucher(c.channelId, checked(5_000_001n))).toEqual({ kind: "above_deposit" });
    expect(await store.get(c.channelId)).toMatchObject({ deposit: 5_000_000n, highest: c.voucher });
    expect(
      (await store.offerVoucher(c.channelId, checked(6_000_000n, { chainDeposit: 7_000_000n }))).kind,
    ).toBe("accepted");
    expect(await store.get(c.channelId)).toMatchObject({
      deposit: 7_000_000n,
      highest: { cumulative: 6_000_000n },
    });
    // A lower deposit on chain (a stale read) never lowers the stored one.
    expect((await store.offerVoucher(c.channelId, checked(6_500_000n, { chainDeposit: 1n }))).kind).toBe(
      "accepted",
    );
    expect((await store.get(c.channelId))?.deposit).toBe(7_000_000n);
    // Nothing but an accept moves the deposit.
    await store.offerVoucher(c.channelId, checked(7_000_001n, { chainDeposit: 7_000_000n }));
    await store.offerVoucher(c.channelId, checked(6_000_000n, { chainDeposit: 9_000_000n }));
    expect((await store.get(c.channelId))?.deposit).toBe(7_000_000n);
  });

  it("accepts a voucher and holds in one step; a hold that does not fit leaves the voucher accepted", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    expect(await store.offerVoucher(c.channelId, checked(1_500_000n), hold("r1", 1_400_000n))).toEqual({
      kind: "accepted",
      accepted: 1_500_000n,
      spent: 0n,
      units: 0,
      held: { kind: "reserved", spent: 0n, accepted: 1_500_000n, units: 0 },
    });
    await store.commit(c.channelId, "r1", 400_000n, T0);
    expect(await store.offerVoucher(c.channelId, checked(1_600_000n), hold("r2", 1_200_001n))).toEqual({
      kind: "accepted",
      accepted: 1_600_000n,
      spent: 400_000n,
      units: 1,
      held: { kind: "insufficient" },
    });
    expect(await store.get(c.channelId)).toMatchObject({ highest: { cumulative: 1_600_000n }, held: 0n });
    // A finished reservation id cannot hold again; a refused voucher takes no hold.
    expect(heldOf(await store.offerVoucher(c.channelId, checked(1_700_000n), hold("r1", 1n)))).toEqual({
      kind: "conflict",
    });
    expect(await store.offerVoucher(c.channelId, checked(1_650_000n), hold("r3", 1n))).toEqual({
      kind: "stale",
    });
    expect(await store.offerVoucher(c.channelId, checked(9_000_000n), hold("r3", 1n))).toEqual({
      kind: "above_deposit",
    });
    expect(await store.get(c.channelId)).toMatchObject({ held: 0n, spent: 400_000n });
    // Retrying a live hold's id holds nothing more.
    await store.offerVoucher(c.channelId, checked(1_800_000n), hold("r4", 100_000n));
    expect(
      heldOf(await store.offerVoucher(c.channelId, checked(1_900_000n), hold("r4", 100_000n)))?.kind,
    ).toBe("reserved");
    expect((await store.get(c.channelId))?.held).toBe(100_000n);
  });

  it("never holds more than the accepted voucher under concurrent new vouchers with holds", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    // 40 requests at once, each with its own higher voucher (the order they land in is any).
    const outcomes = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        store.offerVoucher(
          c.channelId,
          checked(1_000_000n + BigInt(i + 1) * 10_000n),
          hold(`r${i}`, 50_000n),
        ),
      ),
    );
    const record = (await store.get(c.channelId))!;
    const held = outcomes.filter((o) => heldOf(o)?.kind === "reserved").length;
    expect(record.highest.cumulative).toBe(1_400_000n);
    expect(record.held).toBe(BigInt(held) * 50_000n);
    expect(record.held).toBeLessThanOrEqual(record.highest.cumulative);
    // Each voucher was accepted or, landing after a higher one, stale (and then held nothing).
    for (const o of outcomes) expect(o.kind === "accepted" || o.kind === "stale").toBe(true);
  });

  it("consumes a challenge with the first hold under it: another reservation is `used` and holds nothing, the same one is the same hold", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    const use = (id: string) => ({ id, until: Date.now() + TTL });
    const reserve = (rid: string, challenge: string) =>
      store.reserve(c.channelId, rid, 100_000n, Date.now(), Date.now() + TTL, use(challenge));
    const offer = (rid: string, challenge: string) =>
      store.offerVoucher(c.channelId, unchecked(c.voucher), {
        ...hold(rid, 100_000n, Date.now()),
        challenge: use(challenge),
      });
    expect((await reserve("r1", "c1")).kind).toBe("reserved");
    // Another reservation presenting the consumed challenge: refused, through either step.
    expect(await reserve("r2", "c1")).toEqual({ kind: "used" });
    expect(heldOf(await offer("r2", "c1"))).toEqual({ kind: "used" });
    // The same reservation again (a retried request) is the same hold, through either step.
    expect((await reserve("r1", "c1")).kind).toBe("reserved");
    expect(heldOf(await offer("r1", "c1"))?.kind).toBe("reserved");
    expect((await store.get(c.channelId))?.held).toBe(100_000n);
    // A hold taken by the voucher step consumes its challenge for reserve as well.
    expect(heldOf(await offer("r3", "c3"))?.kind).toBe("reserved");
    expect(await reserve("r4", "c3")).toEqual({ kind: "used" });
    // Committed or released, the challenge stays consumed.
    await store.commit(c.channelId, "r1", 7n, Date.now());
    await store.release(c.channelId, "r3", Date.now());
    expect(await reserve("r5", "c1")).toEqual({ kind: "used" });
    expect(heldOf(await offer("r5", "c3"))).toEqual({ kind: "used" });
    expect(await store.get(c.channelId)).toMatchObject({ held: 0n, spent: 7n, units: 1 });
    // A hold without a challenge (none to consume) and a fresh challenge still hold.
    expect((await store.reserve(c.channelId, "r6", 1n, Date.now(), Date.now() + TTL)).kind).toBe("reserved");
    expect((await reserve("r7", "c7")).kind).toBe("reserved");
  });

  it("is not consumed by a hold that was not taken, and is forgotten after its time", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    const now = Date.now();
    const soon = { id: "c1", until: now + 150 };
    expect((await store.reserve(c.channelId, "r1", 1_000_001n, now, now + TTL, soon)).kind).toBe(
      "insufficient",
    );
    expect((await store.reserve(c.channelId, "r2", 1n, now, now + TTL, soon)).kind).toBe("reserved");
    expect((await store.reserve(c.channelId, "r3", 1n, now, now + TTL, soon)).kind).toBe("used");
    await new Promise((r) => setTimeout(r, 300));
    const later = Date.now();
    expect((await store.reserve(c.channelId, "r3", 1n, later, later + TTL, soon)).kind).toBe("reserved");
  });

  it("serves exactly one of concurrent holds presenting one challenge", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    const now = Date.now();
    const challenge = { id: "c1", until: now + TTL };
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        i % 2 === 0
          ? store.reserve(c.channelId, `r${i}`, 1_000n, now, now + TTL, challenge)
          : store
              .offerVoucher(c.channelId, unchecked(c.voucher), { ...hold(`r${i}`, 1_000n, now), challenge })
              .then((o) => heldOf(o)!),
      ),
    );
    expect(outcomes.filter((o) => o.kind === "reserved")).toHaveLength(1);
    expect(outcomes.filter((o) => o.kind === "used")).toHaveLength(9);
    expect((await store.get(c.channelId))?.held).toBe(1_000n);
  });

  it("holds quotes inside the accepted cumulative and refuses what does not fit", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    expect((await store.reserve(c.channelId, "r1", 600_000n, T0, T0 + TTL)).kind).toBe("reserved");
    expect((await store.reserve(c.channelId, "r2", 400_001n, T0, T0 + TTL)).kind).toBe("insufficient");
    expect((await store.reserve(c.channelId, "r2", 400_000n, T0, T0 + TTL)).kind).toBe("reserved");
    expect(await store.get(c.channelId)).toMatchObject({ held: 1_000_000n, spent: 0n });
    // Reserving the same id again holds nothing more.
    expect((await store.reserve(c.channelId, "r1", 600_000n, T0, T0 + TTL)).kind).toBe("reserved");
    expect((await store.get(c.channelId))?.held).toBe(1_000_000n);
    expect((await store.reserve(newChannel().channelId, "r3", 1n, T0, T0 + TTL)).kind).toBe("unknown");
  });

  it("holds on an unchecked voucher only when it is the accepted one, and then as reserve does", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    const accepted = c.voucher;
    const shouted = { ...accepted, signature: accepted.signature.toUpperCase().replace("0X", "0x") as Hex };
    const reserved = { kind: "reserved", spent: 0n, accepted: 1_000_000n, units: 0 };
    const same = { kind: "same", accepted: 1_000_000n, spent: 0n, units: 0 };
    const offer = (v: { cumulative: bigint; signature: Hex }, rid: string, amount: bigint) =>
      store.offerVoucher(c.channelId, unchecked(v), hold(rid, amount));
    expect(await offer(accepted, "r1", 600_000n)).toEqual({ ...same, held: reserved });
    expect(await offer(shouted, "r2", 300_000n)).toEqual({ ...same, held: reserved });
    // Another signature, a lower or a higher cumulative: not the accepted voucher, nothing held.
    for (const other of [
      { ...accepted, signature: sig() },
      { ...accepted, cumulative: 999_999n },
      { ...accepted, cumulative: 2_000_000n },
    ]) {
      expect(await offer(other, "r3", 1n)).toEqual({ kind: "unchecked" });
    }
    expect(await store.get(c.channelId)).toMatchObject({ held: 900_000n, highest: accepted });
    expect(heldOf(await offer(accepted, "r3", 100_001n))?.kind).toBe("insufficient");
    // The same id again holds nothing more; a finished one cannot hold again.
    expect(heldOf(await offer(accepted, "r1", 600_000n))?.kind).toBe("reserved");
    await store.commit(c.channelId, "r1", 10n, T0);
    expect(heldOf(await offer(accepted, "r1", 1n))?.kind).toBe("conflict");
    expect(await store.get(c.channelId)).toMatchObject({ held: 300_000n, spent: 10n, units: 1 });
    expect((await store.beginClose(c.channelId, T0, 60_000)).kind).toBe("busy");
    await store.release(c.channelId, "r2", T0);
    expect((await store.beginClose(c.channelId, T0, 60_000)).kind).toBe("ok");
    expect(await offer(accepted, "r4", 1n)).toEqual({ kind: "not_open" });
    expect(await store.offerVoucher(newChannel().channelId, unchecked(accepted), hold("r5", 1n))).toEqual({
      kind: "unknown",
    });
  });

  it("commits min(actual, hold), releases the rest, counts units and answers a repeat alike", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    await store.reserve(c.channelId, "r1", 300_000n, T0, T0 + TTL);
    await store.reserve(c.channelId, "r2", 300_000n, T0, T0 + TTL);
    const first = await store.commit(c.channelId, "r1", 120_000n, T0 + 10);
    expect(first).toEqual({
      kind: "committed",
      spent: 120_000n,
      accepted: 1_000_000n,
      units: 1,
      committedAt: T0 + 10,
      charged: 120_000n,
    });
    // Above the hold: only the hold is charged, and the outcome says so.
    expect(await store.commit(c.channelId, "r2", 999_999n, T0 + 20)).toMatchObject({
      spent: 420_000n,
      units: 2,
      charged: 300_000n,
    });
    expect(await store.commit(c.channelId, "r2", 999_999n, T0 + 25)).toMatchObject({ charged: 300_000n });
    expect(await store.commit(c.channelId, "r1", 5n, T0 + 30)).toEqual(first);
    expect(await store.get(c.channelId)).toMatchObject({ spent: 420_000n, held: 0n, units: 2 });
    expect((await store.reserve(c.channelId, "r3", 580_000n, T0, T0 + TTL)).kind).toBe("reserved");
    expect((await store.reserve(c.channelId, "r4", 1n, T0, T0 + TTL)).kind).toBe("insufficient");
    expect(await store.commit(c.channelId, "nope", 1n, T0)).toEqual({ kind: "unknown" });
    // A finished reservation id cannot hold again.
    expect((await store.reserve(c.channelId, "r1", 1n, T0, T0 + TTL)).kind).toBe("conflict");
  });

  it("releases a hold once; a released reservation cannot be committed", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    await store.reserve(c.channelId, "r1", 700_000n, T0, T0 + TTL);
    expect(await store.release(c.channelId, "r1", T0)).toBe("released");
    expect(await store.get(c.channelId)).toMatchObject({ held: 0n, spent: 0n, units: 0 });
    expect(await store.release(c.channelId, "r1", T0)).toBe("released_before");
    expect(await store.commit(c.channelId, "r1", 1n, T0)).toEqual({ kind: "released" });
    expect(await store.release(c.channelId, "unknown", T0)).toBe("unknown");
    await store.reserve(c.channelId, "r2", 1n, T0, T0 + TTL);
    await store.commit(c.channelId, "r2", 1n, T0);
    expect(await store.release(c.channelId, "r2", T0)).toBe("committed");
    expect((await store.get(c.channelId))?.spent).toBe(1n);
  });

  it("drops a hold at its expiry: the amount is available again and the commit fails", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    expect((await store.reserve(c.channelId, "r1", 1_000_000n, T0, T0 + 1_000)).kind).toBe("reserved");
    expect((await store.reserve(c.channelId, "r2", 1n, T0 + 999, T0 + TTL)).kind).toBe("insufficient");
    expect((await store.reserve(c.channelId, "r2", 1_000_000n, T0 + 1_000, T0 + TTL)).kind).toBe("reserved");
    expect(await store.commit(c.channelId, "r1", 10n, T0 + 1_001)).toEqual({ kind: "expired" });
    expect(await store.get(c.channelId)).toMatchObject({ held: 1_000_000n, spent: 0n });
  });

  it("marks a channel closing only without live holds, refuses holds while closing, rolls back or finalizes", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    await store.reserve(c.channelId, "r1", 10n, T0, T0 + TTL);
    expect((await store.beginClose(c.channelId, T0, 60_000)).kind).toBe("busy");
    await store.commit(c.channelId, "r1", 10n, T0);
    const begun = await store.beginClose(c.channelId, T0 + 1, 60_000);
    expect(begun).toMatchObject({ kind: "ok", record: { status: "closing", spent: 10n } });
    if (begun.kind !== "ok") throw new Error("not begun");
    expect((await store.reserve(c.channelId, "r2", 1n, T0, T0 + TTL)).kind).toBe("not_open");
    expect(await store.offerVoucher(c.channelId, checked(2_000_000n))).toEqual({ kind: "not_open" });
    expect((await store.beginClose(c.channelId, T0 + 2, 60_000)).kind).toBe("closing");
    // A stale mark (a crashed close) can be taken over; the old attempt can no longer roll back.
    const takeover = await store.beginClose(c.channelId, T0 + 60_001, 60_000);
    expect(takeover.kind).toBe("ok");
    await store.abortClose(c.channelId, begun.token);
    expect((await store.get(c.channelId))?.status).toBe("closing");
    if (takeover.kind !== "ok") throw new Error("not taken over");
    await store.abortClose(c.channelId, takeover.token);
    expect((await store.get(c.channelId))?.status).toBe("open");
    expect((await store.reserve(c.channelId, "r2", 1n, T0, T0 + TTL)).kind).toBe("reserved");
    await store.release(c.channelId, "r2", T0);
    const again = await store.beginClose(c.channelId, T0 + 70_000, 60_000);
    expect(again.kind).toBe("ok");
    await store.finishClose(c.channelId, {
      txHash: keccak256("0x01"),
      cumulative: 1_000_000n,
      captured: 10n,
    });
    expect(await store.get(c.channelId)).toMatchObject({
      status: "closed",
      settled: 10n,
      closed: { txHash: keccak256("0x01"), cumulative: 1_000_000n, captured: 10n },
    });
    expect((await store.beginClose(c.channelId, T0 + 80_000, 60_000)).kind).toBe("closed");
  });

  it("raises the deposit and the settled amount, and forgets settled vouchers but the highest", async () => {
    const store = await makeStore();
    const c = newChannel(1_000_000n);
    await store.create(c);
    await store.raiseDeposit(c.channelId, 7_000_000n);
    await store.raiseDeposit(c.channelId, 6_000_000n);
    for (const cumulative of [2_000_000n, 3_000_000n])
      await store.offerVoucher(c.channelId, checked(cumulative, { chainDeposit: 7_000_000n }));
    await store.recordSettled(c.channelId, 2_000_000n);
    await store.recordSettled(c.channelId, 1_500_000n);
    expect(await store.get(c.channelId)).toMatchObject({ deposit: 7_000_000n, settled: 2_000_000n });
    expect((await store.vouchers(c.channelId)).map((v) => v.cumulative)).toEqual([3_000_000n]);
    await store.recordSettled(c.channelId, 3_000_000n);
    expect((await store.vouchers(c.channelId)).map((v) => v.cumulative)).toEqual([3_000_000n]);
  });

  it("keeps the settlement list and leases", async () => {
    const store = await makeStore();
    const c = newChannel();
    await store.markDirty(c.channelId);
    await store.markDirty(c.channelId);
    expect(await store.dirty()).toContain(c.channelId);
    await store.clearDirty(c.channelId);
    expect(await store.dirty()).not.toContain(c.channelId);
    const lease = `lease-${toHex(randomBytes(4))}`;
    expect(await store.tryLock(lease, "a", 60_000)).toBe(true);
    expect(await store.tryLock(lease, "b", 60_000)).toBe(false);
    expect(await store.tryLock(lease, "a", 60_000)).toBe(true);
    await store.unlock(lease, "b");
    expect(await store.tryLock(lease, "b", 60_000)).toBe(false);
    await store.unlock(lease, "a");
    expect(await store.tryLock(lease, "b", 60_000)).toBe(true);
  });
}
