import type { Address, Hex } from "viem";

/** One level of the log: structured ids first, then a fixed message (pino's call shape). */
export interface LogFn {
  (fields: object, message?: string): void;
  (message: string): void;
}

/**
 * The logger the domain writes to: fixed messages, structured ids, never payment material.
 * The service's pino logger (@tollgate/kit/log) is one.
 */
export interface Log {
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
}

/** A TIP-1034 channel descriptor; its keccak hash (with escrow and chain id) is the channel id. */
export interface ChannelDescriptor {
  payer: Address;
  payee: Address;
  operator: Address;
  token: Address;
  salt: Hex;
  authorizedSigner: Address;
  expiringNonceHash: Hex;
}

/** A cumulative voucher and its EIP-712 signature. */
export interface SignedVoucher {
  cumulative: bigint;
  signature: Hex;
}

/** open: accepts holds; closing: a close is in flight, holds are refused; closed: finalized on chain. */
export type ChannelStatus = "open" | "closing" | "closed";

/** One channel as the store keeps it. All amounts are base units. */
export interface ChannelRecord {
  /** Lowercase 0x-prefixed keccak id. */
  channelId: Hex;
  descriptor: ChannelDescriptor;
  /** Deposit verified on chain (open, top-ups, reads). */
  deposit: bigint;
  /** Amount settled to the payee on chain so far. */
  settled: bigint;
  /** The highest accepted voucher: the accepted cumulative and its signature. */
  highest: SignedVoucher;
  /** Committed spend. */
  spent: bigint;
  /** Sum of live holds. */
  held: bigint;
  /** Committed requests. */
  units: number;
  status: ChannelStatus;
  /** Set once closed: what the close transaction captured. */
  closed?: { txHash: Hex; cumulative: bigint; captured: bigint };
}

/** A channel to create after a verified open. */
export interface NewChannel {
  channelId: Hex;
  descriptor: ChannelDescriptor;
  deposit: bigint;
  settled: bigint;
  voucher: SignedVoucher;
}

/**
 * Result of a reserve: `conflict` means the reservation id is taken by a finished reservation;
 * `used`, that the challenge the hold pays under already paid for another reservation (nothing
 * held). `reserved` carries the channel's committed spend, accepted cumulative and committed
 * requests read in the same step, while the hold is live: spent + the hold ≤ accepted, so spent
 * plus any charge within the hold is a spend the accepted voucher covers.
 */
export type ReserveOutcome =
  | { kind: "reserved"; spent: bigint; accepted: bigint; units: number }
  | { kind: "insufficient" | "not_open" | "unknown" | "conflict" | "used" };

/**
 * The challenge a content request's hold pays under: one challenge pays for one request
 * (docs/paid-door.md, "One challenge, one request"). The first hold taken under `id` consumes
 * it, and the store remembers which reservation did until `until` (ms, at least the challenge's
 * expiry): another reservation presenting it is `used`, the same one (a retry) is the same hold.
 */
export interface ChallengeUse {
  id: string;
  until: number;
}

/**
 * A voucher offered to a channel, with what the domain checked and read before the store step:
 * whether its signature was verified against the channel's descriptor, and the channel's
 * on-chain deposit and settled amount (docs/paid-door.md, "One round trip").
 */
export interface OfferedVoucher extends SignedVoucher {
  /**
   * The signature was verified. When false, only the channel's accepted voucher itself (its
   * cumulative the highest, its signature the stored one's, case aside) passes; any other answers
   * `unchecked` and changes nothing.
   */
  checked: boolean;
  /** The deposit read on chain, at most MAX_AMOUNT; the stored deposit rises to it on an accept. */
  chainDeposit: bigint;
  /** The settled amount read on chain. */
  chainSettled: bigint;
}

/** A hold to take in the same step as a voucher's accept: `reserve`'s arguments. */
export interface HoldRequest {
  reservationId: string;
  amount: bigint;
  now: number;
  expiresAt: number;
  challenge?: ChallengeUse;
}

/**
 * Result of offering a voucher. `accepted`: it raised the accepted cumulative; `same`: it equals
 * it (nothing changed). Both carry the channel's accepted cumulative, committed spend and
 * committed requests after the step, and `held`, what the hold asked for answered (as `reserve`
 * does). The others change nothing: `unknown` channel; `not_open` (closing or closed); `stale`,
 * below the accepted cumulative; `unchecked`, not the accepted voucher and not `checked`;
 * `settled`, a raise not above the settled amount (stored or on chain); `above_deposit`, a raise
 * above the deposit (stored or on chain).
 */
export type OfferVoucherOutcome =
  | { kind: "accepted" | "same"; accepted: bigint; spent: bigint; units: number; held?: ReserveOutcome }
  | { kind: "unknown" | "not_open" | "stale" | "unchecked" | "settled" | "above_deposit" };

/** Result of a commit; a repeated commit returns the first one's figures. */
export type CommitOutcome =
  | {
      kind: "committed";
      spent: bigint;
      accepted: bigint;
      units: number;
      committedAt: number;
      /** What this reservation was charged: its actual cost, or its hold when the cost was above it. */
      charged: bigint;
    }
  | { kind: "unknown" | "released" | "expired" };

/** Result of a release; releasing twice, or an expired or unknown reservation, changes nothing. */
export type ReleaseOutcome = "released" | "unknown" | "released_before" | "committed" | "expired";

/** Result of marking a channel closing; `token` identifies this close attempt. */
export type BeginCloseOutcome =
  | { kind: "ok"; token: number; record: ChannelRecord }
  | { kind: "unknown" | "closed" | "closing" | "busy" };

/**
 * Per-channel state, linearizable per channel across replicas: every check-and-update is one
 * atomic step (one Lua script in Redis). Amounts never exceed 2^53 − 1 (see amounts.ts).
 */
export interface ChannelStore {
  /** The channel, or undefined when unknown. */
  get(channelId: Hex): Promise<ChannelRecord | undefined>;
  /** Creates the channel with its first voucher; false when it already exists (nothing changes). */
  create(channel: NewChannel): Promise<boolean>;
  /**
   * Offers a voucher to the channel and, given `hold`, takes that hold in the same atomic step
   * (one store round trip for any voucher: docs/paid-door.md, "One round trip"). A voucher above
   * the accepted cumulative raises it when it is `checked`, above the settled amount and within
   * the deposit (stored or on chain; the stored one rises to the chain's); an equal one is
   * `same`. The hold is then taken as `reserve` takes it; a hold that cannot be taken leaves
   * the voucher accepted.
   */
  offerVoucher(channelId: Hex, voucher: OfferedVoucher, hold?: HoldRequest): Promise<OfferVoucherOutcome>;
  /** Raises the stored deposit to `deposit` when it is higher. */
  raiseDeposit(channelId: Hex, deposit: bigint): Promise<void>;
  /**
   * Holds `amount` inside the accepted cumulative (available = highest − spent − held) until
   * `expiresAt` (ms); expired holds are dropped first. Reserving an id that is still held again
   * is a no-op that answers `reserved` (with the figures of now). Given `challenge`, a challenge
   * a hold of another reservation id consumed answers `used` and holds nothing; a hold taken
   * consumes it (ChallengeUse), in the same step.
   */
  reserve(
    channelId: Hex,
    reservationId: string,
    amount: bigint,
    now: number,
    expiresAt: number,
    challenge?: ChallengeUse,
  ): Promise<ReserveOutcome>;
  /** spent += min(actual, hold), releases the hold, units += 1; idempotent by reservation id. */
  commit(channelId: Hex, reservationId: string, actual: bigint, now: number): Promise<CommitOutcome>;
  /** Returns a live hold; idempotent by reservation id. */
  release(channelId: Hex, reservationId: string, now: number): Promise<ReleaseOutcome>;
  /**
   * Marks an open channel closing so that reserves fail, when it has no live hold. A closing
   * mark older than `staleAfterMs` (a crashed close) may be taken over.
   */
  beginClose(channelId: Hex, now: number, staleAfterMs: number): Promise<BeginCloseOutcome>;
  /** Rolls a closing mark back to open, when it is still the mark `token` set. */
  abortClose(channelId: Hex, token: number): Promise<void>;
  /** Finalizes the channel: closed, settled = captured, the close recorded for idempotent replies. */
  finishClose(channelId: Hex, close: { txHash: Hex; cumulative: bigint; captured: bigint }): Promise<void>;
  /** Raises the settled amount and forgets vouchers at or below it (except the highest). */
  recordSettled(channelId: Hex, settled: bigint): Promise<void>;
  /** Every accepted voucher still above the settled amount, plus the highest. */
  vouchers(channelId: Hex): Promise<SignedVoucher[]>;
  /** Notes a channel with spend that may be unsettled, for the settlement worker. */
  markDirty(channelId: Hex): Promise<void>;
  /** Removes a channel from the settlement worker's list. */
  clearDirty(channelId: Hex): Promise<void>;
  /** Channels noted by markDirty. */
  dirty(): Promise<Hex[]>;
  /** Takes a named lease for `ttlMs` when nobody holds it. */
  tryLock(name: string, owner: string, ttlMs: number): Promise<boolean>;
  /** Gives a lease back, when `owner` still holds it. */
  unlock(name: string, owner: string): Promise<void>;
}

/** On-chain channel state; a finalized or never-opened channel reads as all zero. */
export interface OnChainState {
  deposit: bigint;
  settled: bigint;
  /** Block timestamp of the payer's requestClose; 0 when none is pending. */
  closeRequestedAt: number;
}

/**
 * The Tempo chain as the payment domain needs it. The check* methods are pure (no RPC); the
 * others speak JSON-RPC through the one adapter (tempo-rpc-chain.ts). Failures are thrown as
 * plain errors; the domain decides which code they become.
 */
export interface Chain {
  /** Decodes a client-signed open transaction and checks it against the credential; returns its deposit. */
  checkOpen(transaction: Hex, descriptor: ChannelDescriptor, channelId: Hex): { deposit: bigint };
  /** Broadcasts a checked open, waits for it, checks ChannelOpened and reads back at the receipt block. */
  submitOpen(
    transaction: Hex,
    descriptor: ChannelDescriptor,
    channelId: Hex,
  ): Promise<{ txHash: Hex; deposit: bigint }>;
  /** Decodes a client-signed top-up transaction and checks it against the stored descriptor. */
  checkTopUp(
    transaction: Hex,
    descriptor: ChannelDescriptor,
    channelId: Hex,
    additionalDeposit: bigint,
  ): void;
  /** Broadcasts a checked top-up, waits for it, checks TopUp and reads back the new deposit. */
  submitTopUp(
    transaction: Hex,
    descriptor: ChannelDescriptor,
    channelId: Hex,
    additionalDeposit: bigint,
  ): Promise<{ txHash: Hex; deposit: bigint }>;
  /** The channel's latest on-chain state. */
  state(channelId: Hex): Promise<OnChainState>;
  /** Whether the payee key is configured, so settle and close can be sent. */
  readonly canSend: boolean;
  /** Sends escrow.settle from the payee and waits for Settled; returns the new settled amount. */
  settle(
    descriptor: ChannelDescriptor,
    channelId: Hex,
    voucher: SignedVoucher,
  ): Promise<{ txHash: Hex; settled: bigint }>;
  /** Sends escrow.close from the payee and waits for ChannelClosed. */
  close(
    descriptor: ChannelDescriptor,
    channelId: Hex,
    voucher: SignedVoucher,
    capture: bigint,
  ): Promise<{ txHash: Hex; settledToPayee: bigint; refundedToPayer: bigint }>;
}
