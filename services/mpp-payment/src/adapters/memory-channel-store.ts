import type { Hex } from "viem";
import type {
  ChallengeUse,
  ChannelRecord,
  ChannelStore,
  ReserveOutcome,
  SignedVoucher,
} from "../domain/ports.js";

/** Options of the in-memory store. */
export interface MemoryChannelStoreOptions {
  /** How long a finished reservation is remembered for idempotent commit and release. Default 24 h. */
  reservationRetentionMs?: number;
  /** Milliseconds since the epoch, for leases and retention. */
  now?: () => number;
}

interface Reservation {
  channelId: Hex;
  amount: bigint;
  state: "held" | "committed" | "released" | "expired";
  expiresAt: number;
  committed?: { spent: bigint; accepted: bigint; units: number; committedAt: number; charged: bigint };
  /** When a finished reservation may be forgotten. */
  forgetAt: number;
}

interface Channel {
  record: ChannelRecord;
  closingSince: number;
  /** Accepted vouchers by cumulative (decimal string). */
  vouchers: Map<string, SignedVoucher>;
  /** Live holds: reservation id → amount and expiry. */
  holds: Map<string, { amount: bigint; expiresAt: number }>;
  /** Used challenges: challenge id → the reservation whose hold consumed it, until when. */
  used: Map<string, { reservationId: string; until: number }>;
}

/** How often finished reservations past their retention are dropped, at most. */
const FORGET_EVERY_MS = 60_000;

/** The memory channel store, and what it holds (for tests of its memory). */
export interface MemoryChannelStore extends ChannelStore {
  retained(): { reservations: number; usedChallenges: number };
}

/**
 * The channel store of the all-in-one process without Redis, and of unit tests. It has the
 * Redis store's semantics; every operation is atomic because it never awaits between its check
 * and its update. State lives only as long as the process.
 */
export function createMemoryChannelStore(opts: MemoryChannelStoreOptions = {}): MemoryChannelStore {
  const retentionMs = opts.reservationRetentionMs ?? 24 * 3_600_000;
  const clock = opts.now ?? Date.now;
  const channels = new Map<Hex, Channel>();
  const reservations = new Map<string, Reservation>();
  const dirty = new Set<Hex>();
  const leases = new Map<string, { owner: string; until: number }>();
  let nextForget = Number.NEGATIVE_INFINITY;

  const copy = (c: Channel): ChannelRecord => ({
    ...c.record,
    descriptor: { ...c.record.descriptor },
    highest: { ...c.record.highest },
    ...(c.record.closed ? { closed: { ...c.record.closed } } : {}),
  });

  const key = (channelId: Hex, reservationId: string) => `${channelId}|${reservationId}`;

  /** Drops expired holds of a channel, as the Redis scripts do before every check. */
  const sweep = (c: Channel, now: number) => {
    for (const [id, hold] of c.holds) {
      if (hold.expiresAt > now) continue;
      c.holds.delete(id);
      c.record.held -= hold.amount;
    }
  };

  /** Drops the used marks of a channel whose challenges can no longer be presented. */
  const sweepUsed = (c: Channel, now: number) => {
    for (const [id, mark] of c.used) if (mark.until <= now) c.used.delete(id);
  };

  const forget = (now: number) => {
    if (now < nextForget) return;
    for (const [k, r] of reservations) if (r.forgetAt <= now) reservations.delete(k);
    for (const c of channels.values()) sweepUsed(c, now);
    // Once a minute (not once a retention): what is kept stays within the retention.
    nextForget = now + Math.min(retentionMs, FORGET_EVERY_MS);
  };

  /** `reserve`, synchronous: it runs inside another step (offerVoucher) without a gap. */
  const reserveNow = (
    channelId: Hex,
    reservationId: string,
    amount: bigint,
    now: number,
    expiresAt: number,
    challenge?: ChallengeUse,
  ): ReserveOutcome => {
    forget(now);
    const c = channels.get(channelId);
    if (!c) return { kind: "unknown" };
    if (challenge) {
      sweepUsed(c, now);
      const by = c.used.get(challenge.id);
      if (by && by.reservationId !== reservationId) return { kind: "used" };
    }
    sweep(c, now);
    const reserved = () => {
      if (challenge) c.used.set(challenge.id, { reservationId, until: challenge.until });
      return {
        kind: "reserved",
        spent: c.record.spent,
        accepted: c.record.highest.cumulative,
        units: c.record.units,
      } as const;
    };
    const existing = reservations.get(key(channelId, reservationId));
    if (existing)
      return existing.state === "held" && c.holds.has(reservationId) ? reserved() : { kind: "conflict" };
    if (c.record.status !== "open") return { kind: "not_open" };
    const available = c.record.highest.cumulative - c.record.spent - c.record.held;
    if (amount > available) return { kind: "insufficient" };
    c.record.held += amount;
    c.holds.set(reservationId, { amount, expiresAt });
    reservations.set(key(channelId, reservationId), {
      channelId,
      amount,
      state: "held",
      expiresAt,
      forgetAt: expiresAt + retentionMs,
    });
    return reserved();
  };

  return {
    retained: () => ({
      reservations: reservations.size,
      usedChallenges: [...channels.values()].reduce((n, c) => n + c.used.size, 0),
    }),
    async get(channelId) {
      const c = channels.get(channelId);
      return c ? copy(c) : undefined;
    },

    async create(ch) {
      if (channels.has(ch.channelId)) return false;
      const vouchers = new Map<string, SignedVoucher>();
      vouchers.set(ch.voucher.cumulative.toString(), { ...ch.voucher });
      channels.set(ch.channelId, {
        record: {
          channelId: ch.channelId,
          descriptor: { ...ch.descriptor },
          deposit: ch.deposit,
          settled: ch.settled,
          highest: { ...ch.voucher },
          spent: 0n,
          held: 0n,
          units: 0,
          status: "open",
        },
        closingSince: 0,
        vouchers,
        holds: new Map(),
        used: new Map(),
      });
      return true;
    },

    async offerVoucher(channelId, voucher, hold) {
      const c = channels.get(channelId);
      if (!c) return { kind: "unknown" };
      const r = c.record;
      if (r.status !== "open") return { kind: "not_open" };
      const highest = r.highest.cumulative;
      if (
        !voucher.checked &&
        (voucher.cumulative !== highest ||
          voucher.signature.toLowerCase() !== r.highest.signature.toLowerCase())
      )
        return { kind: "unchecked" };
      if (voucher.cumulative < highest) return { kind: "stale" };
      let kind: "accepted" | "same" = "same";
      if (voucher.cumulative > highest) {
        const settled = voucher.chainSettled > r.settled ? voucher.chainSettled : r.settled;
        if (voucher.cumulative <= settled) return { kind: "settled" };
        const deposit = voucher.chainDeposit > r.deposit ? voucher.chainDeposit : r.deposit;
        if (voucher.cumulative > deposit) return { kind: "above_deposit" };
        const accepted = { cumulative: voucher.cumulative, signature: voucher.signature };
        r.highest = accepted;
        r.deposit = deposit;
        c.vouchers.set(accepted.cumulative.toString(), { ...accepted });
        kind = "accepted";
      }
      const held =
        hold &&
        reserveNow(channelId, hold.reservationId, hold.amount, hold.now, hold.expiresAt, hold.challenge);
      return {
        kind,
        accepted: r.highest.cumulative,
        spent: r.spent,
        units: r.units,
        ...(held ? { held } : {}),
      };
    },

    async raiseDeposit(channelId, deposit) {
      const c = channels.get(channelId);
      if (c && deposit > c.record.deposit) c.record.deposit = deposit;
    },

    async reserve(channelId, reservationId, amount, now, expiresAt, challenge) {
      return reserveNow(channelId, reservationId, amount, now, expiresAt, challenge);
    },

    async commit(channelId, reservationId, actual, now) {
      const r = reservations.get(key(channelId, reservationId));
      if (!r) return { kind: "unknown" };
      if (r.state === "committed" && r.committed) return { kind: "committed", ...r.committed };
      if (r.state !== "held") return { kind: r.state === "released" ? "released" : "expired" };
      const c = channels.get(channelId);
      if (!c) return { kind: "unknown" };
      sweep(c, now);
      const hold = c.holds.get(reservationId);
      if (!hold) {
        r.state = "expired";
        return { kind: "expired" };
      }
      const charge = actual < hold.amount ? actual : hold.amount;
      c.holds.delete(reservationId);
      c.record.held -= hold.amount;
      c.record.spent += charge;
      c.record.units += 1;
      r.state = "committed";
      r.committed = {
        spent: c.record.spent,
        accepted: c.record.highest.cumulative,
        units: c.record.units,
        committedAt: now,
        charged: charge,
      };
      r.forgetAt = now + retentionMs;
      return { kind: "committed", ...r.committed };
    },

    async release(channelId, reservationId, now) {
      const r = reservations.get(key(channelId, reservationId));
      if (!r) return "unknown";
      if (r.state === "committed") return "committed";
      if (r.state === "released") return "released_before";
      if (r.state === "expired") return "expired";
      const c = channels.get(channelId);
      const hold = c?.holds.get(reservationId);
      if (c && hold) {
        c.holds.delete(reservationId);
        c.record.held -= hold.amount;
      }
      r.state = "released";
      r.forgetAt = now + retentionMs;
      return "released";
    },

    async beginClose(channelId, now, staleAfterMs) {
      const c = channels.get(channelId);
      if (!c) return { kind: "unknown" };
      if (c.record.status === "closed") return { kind: "closed" };
      if (c.record.status === "closing" && now - c.closingSince < staleAfterMs) return { kind: "closing" };
      sweep(c, now);
      if (c.record.held > 0n) return { kind: "busy" };
      c.record.status = "closing";
      c.closingSince = now;
      return { kind: "ok", token: now, record: copy(c) };
    },

    async abortClose(channelId, token) {
      const c = channels.get(channelId);
      if (c && c.record.status === "closing" && c.closingSince === token) {
        c.record.status = "open";
        c.closingSince = 0;
      }
    },

    async finishClose(channelId, close) {
      const c = channels.get(channelId);
      if (!c) return;
      c.record.status = "closed";
      c.record.settled = close.captured;
      c.record.closed = { ...close };
    },

    async recordSettled(channelId, settled) {
      const c = channels.get(channelId);
      if (!c) return;
      if (settled > c.record.settled) c.record.settled = settled;
      for (const [k, v] of c.vouchers) {
        if (v.cumulative <= c.record.settled && v.cumulative !== c.record.highest.cumulative)
          c.vouchers.delete(k);
      }
    },

    async vouchers(channelId) {
      const c = channels.get(channelId);
      return c ? [...c.vouchers.values()].map((v) => ({ ...v })) : [];
    },

    async markDirty(channelId) {
      dirty.add(channelId);
    },

    async clearDirty(channelId) {
      dirty.delete(channelId);
    },

    async dirty() {
      return [...dirty];
    },

    async tryLock(name, owner, ttlMs) {
      const now = clock();
      const lease = leases.get(name);
      if (lease && lease.until > now && lease.owner !== owner) return false;
      leases.set(name, { owner, until: now + ttlMs });
      return true;
    },

    async unlock(name, owner) {
      if (leases.get(name)?.owner === owner) leases.delete(name);
    },
  };
}
