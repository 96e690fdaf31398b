import type { Hex } from "viem";
import type { Catalog } from "./catalog.js";
import { PaymentError } from "./errors.js";
import type { Chain, ChannelStore, Log, OnChainState } from "./ports.js";
import { channelTag, safeCause } from "./safe-log.js";
import type { SessionPayload } from "./session-payload.js";
import type { PaymentSettings } from "./settings.js";

/** What the payment domain is built from. */
export interface PaymentsDeps {
  settings: PaymentSettings;
  catalog: Catalog;
  store: ChannelStore;
  chain: Chain;
  log: Log;
  /** Milliseconds since the epoch. */
  now?: () => number;
  /**
   * How long an on-chain state read is reused when checking vouchers. Default 5 s (mppx's
   * channelStateTtl).
   */
  chainStateTtlMs?: number;
  /** A closing mark older than this is taken to be a crashed close and may be taken over. Default 120 s. */
  staleCloseMs?: number;
  /**
   * How long a close waits for the channel's live holds to be committed or released before it
   * answers that requests are in flight. Default 10 s.
   */
  closeWaitMs?: number;
  /**
   * A commit whose actual cost was above its hold, so the hold was charged (counted by the
   * caller): a usage event or a caller naming more than the request's quote.
   */
  onOverHold?: (over: { actual: bigint; charged: bigint }) => void;
}

/** The deps with their defaults filled in, and the per-instance on-chain state cache. */
export interface PaymentContext {
  s: PaymentSettings;
  catalog: Catalog;
  store: ChannelStore;
  chain: Chain;
  log: Log;
  now: () => number;
  staleCloseMs: number;
  closeWaitMs: number;
  /** Lowercased payer allowlist; undefined admits every payer. */
  allowlist: string[] | undefined;
  /** The channel's on-chain state, reused for `chainStateTtlMs` unless `fresh`. */
  chainState(channelId: Hex, fresh?: boolean): Promise<OnChainState>;
  /** Drops the cached state of a channel whose state a transaction of ours just changed. */
  forgetState(channelId: Hex): void;
  /**
   * Voucher payloads already parsed and bound to their channel (credential.ts), by their JSON
   * text: a reused voucher is not parsed and hashed again on every request. Bounded.
   */
  checkedVouchers: Memo<SessionPayload>;
  /** Channel ids by their descriptor's fields (credential.ts, checkDescriptor). Bounded. */
  channelIds: Memo<Hex>;
  onOverHold: (over: { actual: bigint; charged: bigint }) => void;
}

/** A bounded memo of values computed from a text alone: it forgets everything when full. */
export interface Memo<T> {
  get(key: string): T | undefined;
  set(key: string, value: T): void;
}

/** How many entries a memo keeps before it starts again. */
const MEMO_ENTRIES = 4_096;

function memo<T>(): Memo<T> {
  const map = new Map<string, T>();
  return {
    get: (key) => map.get(key),
    set: (key, value) => {
      if (map.size >= MEMO_ENTRIES) map.clear();
      map.set(key, value);
    },
  };
}

/** Fills in the defaults and builds the state cache. */
export function createContext(deps: PaymentsDeps): PaymentContext {
  const { settings: s, catalog, store, chain, log } = deps;
  const now = deps.now ?? Date.now;
  const chainStateTtlMs = deps.chainStateTtlMs ?? 5_000;
  const stateCache = new Map<Hex, { state: OnChainState; at: number }>();

  async function chainState(channelId: Hex, fresh = false): Promise<OnChainState> {
    const cached = stateCache.get(channelId);
    if (!fresh && cached && now() - cached.at < chainStateTtlMs) return cached.state;
    let state: OnChainState;
    try {
      state = await chain.state(channelId);
    } catch (err) {
      log.warn({ channel: channelTag(channelId), cause: safeCause(err) }, "channel state read failed");
      throw failed("channel state could not be read from the chain", err);
    }
    if (stateCache.size > 10_000) stateCache.clear();
    stateCache.set(channelId, { state, at: now() });
    return state;
  }

  return {
    s,
    catalog,
    store,
    chain,
    log,
    now,
    staleCloseMs: deps.staleCloseMs ?? 120_000,
    closeWaitMs: deps.closeWaitMs ?? 10_000,
    allowlist: s.payerAllowlist?.map((a) => a.toLowerCase()),
    chainState,
    forgetState: (channelId) => {
      stateCache.delete(channelId);
    },
    checkedVouchers: memo(),
    channelIds: memo(),
    onOverHold: deps.onOverHold ?? (() => {}),
  };
}

/** The refusal of a credential that does not hold up. */
export const failed = (message: string, cause?: unknown) =>
  new PaymentError("mpp_payment_verification_failed", message, cause === undefined ? undefined : { cause });

/** Addresses compared without regard to checksum case. */
export const same = (a: string, b: string) => a.toLowerCase() === b.toLowerCase();
