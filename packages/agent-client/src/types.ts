import { Session } from "mppx/tempo";
import type { Address, Hex } from "viem";

/** A session receipt as mppx parses it from `Payment-Receipt`. */
export type SessionReceipt = Session.Precompile.Types.SessionReceipt;
/**
 * The TIP-1034 channel descriptor (payer, payee, operator, token, salt, authorizedSigner,
 * expiringNonceHash).
 */
export type ChannelDescriptor = Session.Precompile.Types.ChannelDescriptor;

/** The gateway's paid route, relative to its base URL (docs/contract.md, "The paid door"). */
export const MPP_CHAT_PATH = "/v1/mpp/chat/completions";
/** Paid attempts per request (the unpaid challenge request is not counted); mppx uses 3 too. */
export const DEFAULT_MAX_ATTEMPTS = 3;
/** The TIP-1034 channel reserve precompile: the only escrow trusted unless `escrow` says otherwise. */
export const DEFAULT_ESCROW = Session.Precompile.Constants.tip20ChannelEscrow as Address;
/** Every TIP-20 token has 6 decimals. */
export const TOKEN_DECIMALS = 6;

/** Why a paid request or a session operation failed. */
export type PaidSessionErrorCode =
  /** The server answered the unpaid request with something other than a 402 challenge. */
  | "unexpected_status"
  /** No usable `tempo/session` v2 challenge (missing, malformed, expired, untrusted escrow, other chain). */
  | "challenge_invalid"
  /** A 2xx without `Payment-Receipt`: a failed payment path (docs/contract.md, "The paid door", rule 5). */
  | "receipt_missing"
  /** A receipt that does not parse or does not match the local voucher state. */
  | "receipt_invalid"
  /** The next voucher or deposit would go over the caller's `maxDeposit`. */
  | "max_deposit_exceeded"
  /** The server did not accept the open credential; the channel is forgotten. */
  | "open_failed"
  /** The top-up credential was not accepted. */
  | "top_up_failed"
  /** The close credential was not accepted; the session stays open. */
  | "close_failed"
  /** 410: the channel is finalized or unknown; the session state is dropped. */
  | "channel_gone"
  /** A 402 whose code's caller action is "stop" (digest mismatch, verification failed, ...). */
  | "payment_rejected"
  /** Any other non-2xx answer (400, 401, 403, 429, 5xx): surfaced with its status and code, not retried. */
  | "http_error"
  /** Still 402 after `maxAttempts` paid attempts. */
  | "retries_exhausted"
  /** The session was closed; open a new PaidSession. */
  | "session_closed"
  /** The challenge names a different payee, token, chain, escrow or operator than the open channel. */
  | "channel_mismatch"
  /** Resumed state that does not verify (channel id, payer, voucher signature). */
  | "state_invalid";

/** An error of the paid path. `serverCode` is the gateway's code (problem+json `code`) when there was one. */
export class PaidSessionError extends Error {
  override readonly name = "PaidSessionError";
  constructor(
    readonly code: PaidSessionErrorCode,
    message: string,
    readonly details: { status?: number; serverCode?: string; problemType?: string; channelId?: Hex } = {},
  ) {
    super(message);
  }
}

/** What a paid attempt did with the voucher. */
export type VoucherAction = "open" | "reuse" | "raise";

/** One paid attempt of a request (the unpaid challenge round trip is not listed). */
export interface PaidAttempt {
  action: VoucherAction;
  /** The cumulative amount of the voucher the credential carried (raw base units). */
  cumulativeAmount: bigint;
  status: number;
  /** The server's code, or the problem type suffix of a plain mppx server, on a failed attempt. */
  code?: string;
}

/** Progress events, for logging (the CLI prints them on stderr). They never carry secrets. */
export type PaidSessionEvent =
  | { type: "attempt"; attempt: PaidAttempt }
  | { type: "open"; channelId: Hex; deposit: bigint; cumulativeAmount: bigint; chainId: number }
  | { type: "raise"; from: bigint; to: bigint; reason: string }
  | { type: "top-up"; additionalDeposit: bigint; deposit: bigint; status: number; reason: string }
  | { type: "close"; channelId: Hex; cumulativeAmount: bigint; status: number };

/** A successful paid response. */
export interface PaidResponse {
  status: number;
  /** The parsed JSON body, or undefined when the body is not JSON. */
  body: unknown;
  text: string;
  receipt: SessionReceipt;
  /**
   * `opened` on the request that opened the channel, `raised` when a higher voucher was signed,
   * else `reused`.
   */
  voucher: "opened" | "reused" | "raised";
  /** The cumulative voucher amount after the request (raw base units). */
  cumulativeAmount: bigint;
  channelId: Hex;
  attempts: PaidAttempt[];
}

/** The outcome of {@link PaidSession.close}. */
export interface CloseResult {
  channelId: Hex;
  /** The final cumulative voucher sent with the close credential. */
  cumulativeAmount: bigint;
  /** What the server captured for the payee (receipt `spent`). */
  spent: bigint;
  /** The channel's deposit as this session knows it; the payer gets `deposit - spent` back. */
  deposit: bigint;
  txHash: Hex;
  receipt: SessionReceipt;
}

/** The session's channel and voucher, as JSON (no secret: the voucher is an authorization, not a key). */
export interface PaidSessionState {
  version: 1;
  /** The paid route URL the channel was opened against. */
  url: string;
  chainId: number;
  escrow: Address;
  channelId: Hex;
  descriptor: ChannelDescriptor;
  deposit: string;
  cumulativeAmount: string;
  signature: Hex;
  spent: string;
  acceptedCumulative: string;
}

/** Options of {@link PaidSession}. */
export interface PaidSessionOptions {
  /** The gateway's base URL, e.g. http://127.0.0.1:8080. */
  url: string;
  /** The paid route under `url`; default {@link MPP_CHAT_PATH}. */
  path?: string;
  /** The payer's secp256k1 private key. It is only used to build a viem local account. */
  privateKey: Hex;
  /** Tempo JSON-RPC URL, used to fill and sign open and top-up transactions (never to broadcast). */
  rpcUrl: string;
  /** Cap on the channel's total deposit (raw base units); also caps the cumulative voucher. */
  maxDeposit?: bigint;
  /** Paid attempts per request; default {@link DEFAULT_MAX_ATTEMPTS}. */
  maxAttempts?: number;
  /** Trusted escrow; default the TIP-1034 precompile. A challenge naming another escrow is refused. */
  escrow?: Address;
  /** Per HTTP request timeout; default 120 s (buffered inference can be slow). */
  timeoutMs?: number;
  /** Resume a channel from {@link PaidSession.state} of an earlier run. */
  state?: PaidSessionState;
  /**
   * Sign a new, higher voucher for every request after the open (spent so far plus the challenge
   * amount, topping up first when it would exceed the deposit), the way mppx's session manager
   * signs one per request, instead of reusing the accepted one until asked to refresh. Default
   * false; for load tests of a server's new-voucher path (bench/README.md).
   */
  voucherEachRequest?: boolean;
  fetch?: typeof globalThis.fetch;
  onEvent?: (event: PaidSessionEvent) => void;
}
