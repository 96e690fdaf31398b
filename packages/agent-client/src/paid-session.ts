import { randomBytes, randomInt } from "node:crypto";
import { Challenge, Credential } from "mppx";
import { Session } from "mppx/tempo";
import {
  type Address,
  type Chain,
  type Client,
  createClient,
  encodeFunctionData,
  type Hex,
  http,
  isAddress,
  isAddressEqual,
  type LocalAccount,
  type Transport,
  toHex,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { getChainId, prepareTransactionRequest, signTransaction } from "viem/actions";
import { tempo, tempoDevnet, tempoLocalnet, tempoModerato } from "viem/chains";
import { Transaction } from "viem/tempo";

const { Channel, Voucher, escrowAbi } = Session.Precompile;
const { deserializeSessionReceipt } = Session.Precompile.Receipt;

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

const ZERO_ADDRESS: Address = "0x0000000000000000000000000000000000000000";
const PROBLEM_TYPE_PREFIX = "https://paymentauth.org/problems/";
const RECEIPT_HEADER = "Payment-Receipt";
const KNOWN_CHAINS: readonly Chain[] = [tempo, tempoModerato, tempoDevnet, tempoLocalnet];
/** A challenge this close to its expiry is not reused for a management POST (close). */
const CHALLENGE_SAFETY_MS = 5_000;

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
  fetch?: typeof globalThis.fetch;
  onEvent?: (event: PaidSessionEvent) => void;
}

/** The payment terms of one `tempo/session` v2 challenge. */
interface SessionTerms {
  challenge: Challenge.Challenge;
  amount: bigint;
  suggestedDeposit: bigint | undefined;
  chainId: number;
  escrow: Address;
  payee: Address;
  token: Address;
  operator: Address;
  feePayer: boolean;
  feeToken: Address | undefined;
}

interface ChannelState {
  channelId: Hex;
  descriptor: ChannelDescriptor;
  chainId: number;
  escrow: Address;
  deposit: bigint;
  /** The current voucher: reused until the server asks for a refresh. */
  cumulativeAmount: bigint;
  signature: Hex;
  /** Highest `spent` and `acceptedCumulative` seen in receipts. */
  spent: bigint;
  acceptedCumulative: bigint;
}

interface Problem {
  code?: string;
  type?: string;
  detail?: string;
}

type NextStep = "raise" | "top-up" | "new-challenge" | "stop";

/**
 * A paying agent's session with the gateway's MPP route: one TIP-1034 channel, one cumulative
 * voucher that is reused across requests until the server asks for a higher one
 * (docs/contract.md, "Payment sessions", rule 4), and a cooperative close (rule 5).
 *
 * Requests on one session are serialized: a channel has one voucher sequence.
 */
export class PaidSession {
  /** The paid route URL. */
  readonly url: string;
  /** The payer's address (public). */
  readonly payer: Address;
  readonly #account: LocalAccount;
  readonly #rpcUrl: string;
  readonly #maxDeposit: bigint | undefined;
  readonly #maxAttempts: number;
  readonly #trustedEscrow: Address;
  readonly #timeoutMs: number;
  readonly #fetch: typeof globalThis.fetch;
  readonly #onEvent: ((event: PaidSessionEvent) => void) | undefined;
  readonly #clients = new Map<number, Client<Transport, Chain>>();
  #channel: ChannelState | undefined;
  #lastChallenge: Challenge.Challenge | undefined;
  #lastBody: string | undefined;
  #closed = false;
  /** The open credential payload, until the server accepts it. */
  #pendingOpen: Record<string, unknown> | undefined;
  #queue: Promise<unknown> = Promise.resolve();

  constructor(options: PaidSessionOptions) {
    this.url = new URL(options.path ?? MPP_CHAT_PATH, options.url).toString();
    this.#account = privateKeyToAccount(options.privateKey);
    this.payer = this.#account.address;
    this.#rpcUrl = options.rpcUrl;
    this.#maxDeposit = options.maxDeposit;
    this.#maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULT_MAX_ATTEMPTS);
    this.#trustedEscrow = options.escrow ?? DEFAULT_ESCROW;
    this.#timeoutMs = options.timeoutMs ?? 120_000;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#onEvent = options.onEvent;
    if (options.state) this.#channel = this.#restore(options.state);
  }

  /** The open channel's id, if any. */
  get channelId(): Hex | undefined {
    return this.#channel?.channelId;
  }

  /** The current cumulative voucher amount (raw base units); 0 before the open. */
  get cumulativeAmount(): bigint {
    return this.#channel?.cumulativeAmount ?? 0n;
  }

  /** The channel's deposit as this session knows it (raw base units). */
  get deposit(): bigint {
    return this.#channel?.deposit ?? 0n;
  }

  /** The highest `spent` of any receipt (raw base units). */
  get spent(): bigint {
    return this.#channel?.spent ?? 0n;
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** The channel and voucher as JSON, to resume or close the session from another process. */
  state(): PaidSessionState | undefined {
    const channel = this.#channel;
    if (!channel || this.#closed) return undefined;
    return {
      version: 1,
      url: this.url,
      chainId: channel.chainId,
      escrow: channel.escrow,
      channelId: channel.channelId,
      descriptor: channel.descriptor,
      deposit: channel.deposit.toString(),
      cumulativeAmount: channel.cumulativeAmount.toString(),
      signature: channel.signature,
      spent: channel.spent.toString(),
      acceptedCumulative: channel.acceptedCumulative.toString(),
    };
  }

  /**
   * Sends one chat request on the paid route: unpaid request → 402 challenge → paid retry of the
   * identical body (docs/contract.md, "The paid door", rules 1, 2, 4). Opens the channel on first use.
   */
  chat(body: Record<string, unknown>): Promise<PaidResponse> {
    return this.#serialize(() => this.#request(JSON.stringify(body)));
  }

  /**
   * Closes the channel with the final cumulative voucher (a bodyless close credential): the service
   * settles the spend and refunds the rest of the deposit (docs/contract.md, "Payment sessions",
   * rule 5). Returns undefined when no channel was opened. `probeBody` is sent unpaid to get a
   * fresh challenge when the session has none (a resumed session) or the last one expired; it never
   * runs a model.
   */
  close(options: { probeBody?: Record<string, unknown> } = {}): Promise<CloseResult | undefined> {
    return this.#serialize(() => this.#close(options.probeBody));
  }

  #serialize<T>(task: () => Promise<T>): Promise<T> {
    const run = this.#queue.then(task, task);
    this.#queue = run.catch(() => undefined);
    return run;
  }

  async #request(bodyText: string): Promise<PaidResponse> {
    if (this.#closed) throw new PaidSessionError("session_closed", "the session is closed");
    this.#lastBody = bodyText;
    const unpaid = await this.#post(bodyText);
    if (unpaid.status !== 402) {
      const problem = await readProblem(unpaid);
      throw new PaidSessionError(
        unpaid.ok ? "unexpected_status" : "http_error",
        `expected a 402 payment challenge for the unpaid request, got ${unpaid.status}${describe(problem)}`,
        problemDetails(unpaid.status, problem),
      );
    }
    let terms = this.#terms(await takeChallenge(unpaid));
    let mode: "reuse" | "raise" = "reuse";
    let raised = false;
    let opened = false;
    const attempts: PaidAttempt[] = [];

    for (let attemptNo = 1; attemptNo <= this.#maxAttempts; attemptNo++) {
      this.#lastChallenge = terms.challenge;
      let action: VoucherAction;
      if (!this.#channel) {
        await this.#open(terms);
        action = "open";
      } else {
        this.#assertSameChannel(terms);
        if (mode === "raise") {
          await this.#raise(terms);
          raised = true;
          action = "raise";
        } else action = "reuse";
      }
      const channel = this.#channel!;
      const payload =
        action === "open" ? this.#pendingOpen! : voucherPayload(channel, "voucher", channel.signature);
      const response = await this.#post(bodyText, terms.challenge, this.#credential(terms, payload));
      const attempt: PaidAttempt = {
        action,
        cumulativeAmount: channel.cumulativeAmount,
        status: response.status,
      };

      if (response.ok) {
        this.#pendingOpen = undefined;
        this.#emit({ type: "attempt", attempt });
        attempts.push(attempt);
        const text = await response.text();
        const receipt = this.#acceptReceipt(response, channel);
        if (action === "open") opened = true;
        return {
          status: response.status,
          body: parseJson(text),
          text,
          receipt,
          voucher: opened ? "opened" : raised ? "raised" : "reused",
          cumulativeAmount: channel.cumulativeAmount,
          channelId: channel.channelId,
          attempts,
        };
      }

      const problem = await readProblem(response);
      const code = problem.code ?? problemSuffix(problem);
      if (code !== undefined) attempt.code = code;
      this.#emit({ type: "attempt", attempt });
      attempts.push(attempt);
      const next = response.status === 402 ? nextStep(problem) : "stop";

      if (action === "open" && this.#acknowledgesOpen(response, channel)) {
        // The server accepted the open though the request failed (its model, say): the failed
        // answer carries the open's receipt, so the channel is kept and the next request pays on it.
        this.#pendingOpen = undefined;
      } else if (action === "open") {
        // mppx does the same: an open the server did not acknowledge is forgotten. The payer can
        // recover an opened-but-unacknowledged channel on chain (requestClose, then withdraw).
        const channelId = channel.channelId;
        this.#channel = undefined;
        this.#pendingOpen = undefined;
        if (next !== "new-challenge") {
          throw new PaidSessionError(
            "open_failed",
            `the open credential was not accepted (${response.status}${describe(problem)}); channel ${channelId} is forgotten`,
            { ...problemDetails(response.status, problem), channelId },
          );
        }
      }
      if (response.status === 410) {
        const channelId = channel.channelId;
        this.#channel = undefined;
        throw new PaidSessionError(
          "channel_gone",
          `the channel is finalized or unknown (410${describe(problem)}); the next request opens a new one`,
          { ...problemDetails(410, problem), channelId },
        );
      }
      if (next === "stop") {
        throw new PaidSessionError(
          response.status === 402 ? "payment_rejected" : "http_error",
          `the paid request failed with ${response.status}${describe(problem)}`,
          problemDetails(response.status, problem),
        );
      }
      // Every retryable 402 carries a fresh challenge for the same body.
      terms = this.#terms(await takeChallenge(response));
      if (next === "raise") mode = "raise";
      else {
        mode = "reuse";
        if (next === "top-up") {
          await this.#topUpFor(terms, channel.cumulativeAmount, code ?? "deposit below request cost");
        }
      }
    }
    throw new PaidSessionError(
      "retries_exhausted",
      `still not paid after ${this.#maxAttempts} paid attempts (${attempts.map((a) => `${a.action}:${a.status}${a.code ? `:${a.code}` : ""}`).join(", ")})`,
    );
  }

  /** Builds and signs the open transaction and the first voucher (cumulative = amount). */
  async #open(terms: SessionTerms): Promise<void> {
    const client = await this.#client(terms.chainId);
    const deposit = openingDeposit(terms.amount, terms.suggestedDeposit, this.#maxDeposit);
    const authorizedSigner = this.#account.address;
    const salt = toHex(randomBytes(32));
    const data = encodeFunctionData({
      abi: escrowAbi,
      functionName: "open",
      args: [terms.payee, terms.operator, terms.token, deposit, salt, authorizedSigner],
    });
    const transaction = await this.#signCalls(client, terms, [{ to: terms.escrow, data }]);
    const expiringNonceHash = Channel.computeExpiringNonceHash(
      Channel.transactionForExpiringNonceHash({
        ...(terms.feePayer ? { feePayer: true as const } : {}),
        transaction: Transaction.deserialize(transaction) as never,
      }),
      { sender: this.#account.address },
    );
    const descriptor: ChannelDescriptor = {
      payer: this.#account.address,
      payee: terms.payee,
      operator: terms.operator,
      token: terms.token,
      salt,
      authorizedSigner,
      expiringNonceHash,
    };
    const channelId = Channel.computeId({ ...descriptor, chainId: terms.chainId, escrow: terms.escrow });
    const cumulativeAmount = terms.amount;
    const signature = await Voucher.signVoucher(
      client,
      this.#account,
      { channelId, cumulativeAmount },
      terms.escrow,
      terms.chainId,
    );
    this.#channel = {
      channelId,
      descriptor,
      chainId: terms.chainId,
      escrow: terms.escrow,
      deposit,
      cumulativeAmount,
      signature,
      spent: 0n,
      acceptedCumulative: 0n,
    };
    this.#pendingOpen = {
      action: "open",
      type: "transaction",
      channelId,
      transaction,
      signature,
      descriptor,
      cumulativeAmount: cumulativeAmount.toString(),
      authorizedSigner,
    };
    this.#emit({ type: "open", channelId, deposit, cumulativeAmount, chainId: terms.chainId });
  }

  /**
   * Signs the next voucher (cumulative + amount), topping the channel up first when it would exceed
   * the deposit.
   */
  async #raise(terms: SessionTerms): Promise<void> {
    const channel = this.#channel!;
    const next = channel.cumulativeAmount + terms.amount;
    if (this.#maxDeposit !== undefined && next > this.#maxDeposit) {
      throw new PaidSessionError(
        "max_deposit_exceeded",
        `the next voucher (${next}) would exceed maxDeposit (${this.#maxDeposit}); close the session or raise the cap`,
        { channelId: channel.channelId },
      );
    }
    if (next > channel.deposit) await this.#topUpFor(terms, next, "next voucher exceeds the deposit");
    const client = await this.#client(channel.chainId);
    const signature = await Voucher.signVoucher(
      client,
      this.#account,
      { channelId: channel.channelId, cumulativeAmount: next },
      channel.escrow,
      channel.chainId,
    );
    this.#emit({ type: "raise", from: channel.cumulativeAmount, to: next, reason: "refresh required" });
    channel.cumulativeAmount = next;
    channel.signature = signature;
  }

  /**
   * Tops the channel up so that it covers `required` (or, when 0, by one suggested deposit):
   * mppx's sizing, max(suggestedDeposit, shortfall) capped by maxDeposit.
   */
  async #topUpFor(terms: SessionTerms, required: bigint, reason: string): Promise<void> {
    const channel = this.#channel!;
    const shortfall = required > channel.deposit ? required - channel.deposit : terms.amount;
    const preferred = terms.suggestedDeposit ?? shortfall;
    let additional = preferred > shortfall ? preferred : shortfall;
    if (this.#maxDeposit !== undefined) {
      const room = this.#maxDeposit - channel.deposit;
      if (room < shortfall || room <= 0n) {
        throw new PaidSessionError(
          "max_deposit_exceeded",
          `a top-up of ${shortfall} would take the deposit (${channel.deposit}) over maxDeposit (${this.#maxDeposit})`,
          { channelId: channel.channelId },
        );
      }
      if (additional > room) additional = room;
    }
    const client = await this.#client(channel.chainId);
    const data = encodeFunctionData({
      abi: escrowAbi,
      functionName: "topUp",
      args: [channel.descriptor, additional],
    });
    const now = Math.floor(Date.now() / 1000);
    const transaction = await this.#signCalls(client, terms, [{ to: channel.escrow, data }], {
      // A random past validAfter keeps otherwise identical top-ups distinct (as mppx does).
      validAfter: randomInt(0, Math.max(1, now - 60)),
    });
    const payload = {
      action: "topUp",
      type: "transaction",
      channelId: channel.channelId,
      transaction,
      descriptor: channel.descriptor,
      additionalDeposit: additional.toString(),
    };
    const { response, problem } = await this.#postManagement(terms.challenge, payload);
    this.#emit({
      type: "top-up",
      additionalDeposit: additional,
      deposit: response.ok ? channel.deposit + additional : channel.deposit,
      status: response.status,
      reason,
    });
    if (!response.ok) {
      throw new PaidSessionError(
        "top_up_failed",
        `the top-up was not accepted (${response.status}${describe(problem)})`,
        { ...problemDetails(response.status, problem), channelId: channel.channelId },
      );
    }
    channel.deposit += additional;
    // The receipt is optional for a top-up in mppx; when present it must describe this channel.
    const header = response.headers.get(RECEIPT_HEADER);
    if (header) this.#checkReceipt(header, channel);
  }

  async #close(probeBody: Record<string, unknown> | undefined): Promise<CloseResult | undefined> {
    const channel = this.#channel;
    if (!channel || this.#closed) return undefined;
    let challenge = this.#lastChallenge;
    if (!challenge || expiresSoon(challenge)) {
      const body = probeBody ? JSON.stringify(probeBody) : this.#lastBody;
      if (!body) {
        throw new PaidSessionError(
          "challenge_invalid",
          "no challenge to close with: pass probeBody (an unpaid request body) to close()",
        );
      }
      const probe = await this.#post(body);
      if (probe.status !== 402) {
        const problem = await readProblem(probe);
        throw new PaidSessionError(
          "unexpected_status",
          `expected a 402 challenge for the close probe, got ${probe.status}${describe(problem)}`,
          problemDetails(probe.status, problem),
        );
      }
      challenge = await takeChallenge(probe);
    }
    const terms = this.#terms(challenge);
    this.#assertSameChannel(terms);
    // The close voucher is the current cumulative voucher: same amount, same (deterministic) signature.
    const payload = voucherPayload(channel, "close", channel.signature);
    const { response, problem, challenge: used } = await this.#postManagement(challenge, payload);
    this.#emit({
      type: "close",
      channelId: channel.channelId,
      cumulativeAmount: channel.cumulativeAmount,
      status: response.status,
    });
    if (!response.ok) {
      throw new PaidSessionError(
        "close_failed",
        `the close was not accepted (${response.status}${describe(problem)}); the session stays open`,
        { ...problemDetails(response.status, problem), channelId: channel.channelId },
      );
    }
    const header = response.headers.get(RECEIPT_HEADER);
    if (!header) {
      throw new PaidSessionError("receipt_missing", `close answered ${response.status} without a receipt`, {
        status: response.status,
        channelId: channel.channelId,
      });
    }
    const receipt = this.#checkReceipt(header, channel);
    const spent = BigInt(receipt.spent);
    const problems: string[] = [];
    if (!receipt.txHash || !/^0x[0-9a-fA-F]{64}$/.test(receipt.txHash)) problems.push("no 32-byte txHash");
    if (receipt.challengeId !== used.id) problems.push("challengeId is not the close challenge's");
    if (receipt.acceptedCumulative !== channel.cumulativeAmount.toString()) {
      problems.push(`acceptedCumulative ${receipt.acceptedCumulative} is not the close amount`);
    }
    if (spent < channel.spent) problems.push(`spent ${spent} is below the confirmed spend ${channel.spent}`);
    if (problems.length > 0) {
      throw new PaidSessionError("receipt_invalid", `close receipt: ${problems.join("; ")}`, {
        channelId: channel.channelId,
      });
    }
    this.#closed = true;
    return {
      channelId: channel.channelId,
      cumulativeAmount: channel.cumulativeAmount,
      spent,
      deposit: channel.deposit,
      txHash: receipt.txHash as Hex,
      receipt,
    };
  }

  /** Validates a content response's receipt against the local voucher state and records `spent`. */
  #acceptReceipt(response: Response, channel: ChannelState): SessionReceipt {
    const header = response.headers.get(RECEIPT_HEADER);
    if (!header) {
      throw new PaidSessionError(
        "receipt_missing",
        `the paid request answered ${response.status} without a Payment-Receipt: a failed payment path (spec, MPP route rule 5)`,
        { status: response.status, channelId: channel.channelId },
      );
    }
    return this.#checkReceipt(header, channel);
  }

  /**
   * Whether a failed answer to the open carries a receipt of that open: this channel, at the
   * opened voucher (as mppx 0.11 keeps a channel whose non-2xx answer has a receipt).
   */
  #acknowledgesOpen(response: Response, channel: ChannelState): boolean {
    const header = response.headers.get(RECEIPT_HEADER);
    if (!header) return false;
    try {
      return this.#checkReceipt(header, channel).acceptedCumulative === channel.cumulativeAmount.toString();
    } catch {
      return false;
    }
  }

  /** spent <= acceptedCumulative <= the local cumulative, on this channel (mppx's client rule). */
  #checkReceipt(header: string, channel: ChannelState): SessionReceipt {
    let receipt: SessionReceipt;
    try {
      receipt = deserializeSessionReceipt(header);
    } catch (error) {
      throw new PaidSessionError(
        "receipt_invalid",
        `unreadable Payment-Receipt: ${(error as Error).message}`,
        {
          channelId: channel.channelId,
        },
      );
    }
    const fail = (why: string) =>
      new PaidSessionError("receipt_invalid", `Payment-Receipt ${why}`, { channelId: channel.channelId });
    if (receipt.channelId.toLowerCase() !== channel.channelId.toLowerCase())
      throw fail("names another channel");
    const spent = parseAmount(receipt.spent);
    const accepted = parseAmount(receipt.acceptedCumulative);
    if (spent === undefined || accepted === undefined) throw fail("has malformed amounts");
    if (spent > accepted) throw fail(`spent ${spent} exceeds acceptedCumulative ${accepted}`);
    if (accepted > channel.cumulativeAmount) {
      throw fail(`acceptedCumulative ${accepted} exceeds the local voucher ${channel.cumulativeAmount}`);
    }
    if (spent > channel.spent) channel.spent = spent;
    if (accepted > channel.acceptedCumulative) channel.acceptedCumulative = accepted;
    return receipt;
  }

  /** A bodyless POST with a management credential; one retry with the fresh challenge of a 402 (as mppx). */
  async #postManagement(
    challenge: Challenge.Challenge,
    payload: Record<string, unknown>,
  ): Promise<{ response: Response; problem: Problem; challenge: Challenge.Challenge }> {
    let used = challenge;
    let response = await this.#post(undefined, used, this.#credential(this.#terms(used), payload));
    if (response.status === 402) {
      const fresh = challengeOf(response);
      if (!fresh) return { response, problem: await readProblem(response), challenge: used };
      await response.body?.cancel();
      used = fresh;
      this.#assertSameChannel(this.#terms(used));
      response = await this.#post(undefined, used, this.#credential(this.#terms(used), payload));
    }
    if (response.ok) {
      await response.body?.cancel();
      return { response, problem: {}, challenge: used };
    }
    return { response, problem: await readProblem(response), challenge: used };
  }

  #credential(terms: SessionTerms, payload: Record<string, unknown>): string {
    return Credential.serialize(
      Credential.from({
        challenge: terms.challenge,
        payload,
        source: `did:pkh:eip155:${terms.chainId}:${this.#account.address}`,
      }),
    );
  }

  async #post(
    body: string | undefined,
    challenge?: Challenge.Challenge,
    credential?: string,
  ): Promise<Response> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (challenge && credential) headers[Challenge.credentialHeader(challenge)] = credential;
    else headers["accept-payment"] = "tempo/session";
    return this.#fetch(this.url, {
      method: "POST",
      headers,
      ...(body !== undefined ? { body } : {}),
      signal: AbortSignal.timeout(this.#timeoutMs),
    });
  }

  async #signCalls(
    client: Client<Transport, Chain>,
    terms: SessionTerms,
    calls: Array<{ to: Address; data: Hex }>,
    extra: { validAfter?: number } = {},
  ): Promise<Hex> {
    // Session transactions use TIP-1009 expiring nonces and pay fees in the channel token,
    // exactly as mppx's client builds them; the server broadcasts them.
    const prepared = await prepareTransactionRequest(client, {
      account: this.#account,
      calls,
      nonceKey: "expiring",
      ...(terms.feePayer ? { feePayer: true } : {}),
      feeToken: terms.feeToken ?? terms.token,
      ...extra,
    } as never);
    return (await signTransaction(client, {
      ...(prepared as object),
      account: this.#account,
    } as never)) as Hex;
  }

  async #client(chainId: number): Promise<Client<Transport, Chain>> {
    const existing = this.#clients.get(chainId);
    if (existing) return existing;
    const chain = KNOWN_CHAINS.find((candidate) => candidate.id === chainId);
    if (!chain)
      throw new PaidSessionError("challenge_invalid", `the challenge names unknown chain ${chainId}`);
    const client = createClient({
      account: this.#account,
      chain,
      transport: http(this.#rpcUrl),
      pollingInterval: 250,
    });
    const rpcChainId = await getChainId(client);
    if (rpcChainId !== chainId) {
      throw new PaidSessionError(
        "challenge_invalid",
        `the challenge is for chain ${chainId} but the RPC serves chain ${rpcChainId}`,
      );
    }
    this.#clients.set(chainId, client);
    return client;
  }

  #terms(challenge: Challenge.Challenge): SessionTerms {
    return readTerms(challenge, this.#trustedEscrow);
  }

  /** A voucher only pays for the channel's own payee, token, chain and escrow. */
  #assertSameChannel(terms: SessionTerms): void {
    const channel = this.#channel;
    if (!channel) return;
    const d = channel.descriptor;
    if (
      terms.chainId !== channel.chainId ||
      !isAddressEqual(terms.escrow, channel.escrow) ||
      !isAddressEqual(terms.payee, d.payee) ||
      !isAddressEqual(terms.token, d.token) ||
      !isAddressEqual(terms.operator, d.operator)
    ) {
      throw new PaidSessionError(
        "channel_mismatch",
        "the challenge's payee, token, chain, escrow or operator differs from the open channel's",
        { channelId: channel.channelId },
      );
    }
  }

  #restore(state: PaidSessionState): ChannelState {
    const invalid = (why: string) => new PaidSessionError("state_invalid", `session state: ${why}`);
    if (state.version !== 1) throw invalid(`unknown version ${String(state.version)}`);
    if (state.url !== this.url) throw invalid(`it belongs to ${state.url}, not ${this.url}`);
    if (!isAddressEqual(state.escrow, this.#trustedEscrow)) throw invalid("untrusted escrow");
    if (!isAddressEqual(state.descriptor.payer, this.payer))
      throw invalid("the payer is not this key's address");
    const computed = Channel.computeId({ ...state.descriptor, chainId: state.chainId, escrow: state.escrow });
    if (computed.toLowerCase() !== state.channelId.toLowerCase()) throw invalid("channelId does not match");
    const amounts = [state.deposit, state.cumulativeAmount, state.spent, state.acceptedCumulative].map(
      parseAmount,
    );
    if (amounts.some((amount) => amount === undefined)) throw invalid("malformed amounts");
    const [deposit, cumulativeAmount, spent, acceptedCumulative] = amounts as [
      bigint,
      bigint,
      bigint,
      bigint,
    ];
    const signer = Channel.resolveAuthorizedSigner(state.descriptor);
    const valid = Voucher.verifyVoucher(
      state.escrow,
      state.chainId,
      { channelId: computed, cumulativeAmount, signature: state.signature },
      signer,
    );
    if (!valid) throw invalid("the voucher signature does not verify");
    return {
      channelId: computed,
      descriptor: state.descriptor,
      chainId: state.chainId,
      escrow: state.escrow,
      deposit,
      cumulativeAmount,
      signature: state.signature,
      spent,
      acceptedCumulative,
    };
  }

  #emit(event: PaidSessionEvent): void {
    try {
      this.#onEvent?.(event);
    } catch {
      // A logging callback never breaks a payment.
    }
  }
}

/** The first text answer of an OpenAI-compatible chat completion body, if any. */
export function answerText(body: unknown): string | undefined {
  const choices = (body as { choices?: unknown } | undefined)?.choices;
  if (!Array.isArray(choices)) return undefined;
  const content = (choices[0] as { message?: { content?: unknown } } | undefined)?.message?.content;
  return typeof content === "string" ? content : undefined;
}

/** max(suggestedDeposit, amount), capped by maxDeposit; the cap must still cover one amount. */
export function openingDeposit(
  amount: bigint,
  suggestedDeposit: bigint | undefined,
  maxDeposit?: bigint,
): bigint {
  if (maxDeposit !== undefined && maxDeposit < amount) {
    throw new PaidSessionError(
      "max_deposit_exceeded",
      `maxDeposit (${maxDeposit}) is below the challenge amount (${amount})`,
    );
  }
  const proposed = suggestedDeposit !== undefined && suggestedDeposit > amount ? suggestedDeposit : amount;
  return maxDeposit !== undefined && proposed > maxDeposit ? maxDeposit : proposed;
}

/**
 * What to do after a 402 on a paid retry. The gateway names its case in problem+json `code`
 * (docs/contract.md, "Errors"); a plain mppx server only in the problem `type`.
 */
function nextStep(problem: Problem): NextStep {
  switch (problem.code) {
    case "mpp_voucher_bucket_refresh_required":
      return "raise";
    case "mpp_session_deposit_below_request_cost":
      return "top-up";
    case "mpp_invalid_challenge":
      return "new-challenge";
    case undefined:
      break;
    default:
      return "stop";
  }
  switch (problemSuffix(problem)) {
    // mppx: accepted − spent cannot cover the request, i.e. the voucher bucket is exhausted.
    case "session/insufficient-balance":
    case "payment-insufficient":
      return "raise";
    case "session/amount-exceeds-deposit":
      return "top-up";
    case "invalid-challenge":
    case "payment-expired":
      return "new-challenge";
    default:
      return "stop";
  }
}

function voucherPayload(channel: ChannelState, action: "voucher" | "close", signature: Hex) {
  return {
    action,
    channelId: channel.channelId,
    descriptor: channel.descriptor,
    cumulativeAmount: channel.cumulativeAmount.toString(),
    signature,
  };
}

function readTerms(challenge: Challenge.Challenge, trustedEscrow: Address): SessionTerms {
  const invalid = (why: string) => new PaidSessionError("challenge_invalid", `payment challenge: ${why}`);
  if (challenge.method !== "tempo" || challenge.intent !== "session") {
    throw invalid(`${challenge.method}/${challenge.intent} is not tempo/session`);
  }
  if (challenge.expires && Date.parse(challenge.expires) <= Date.now()) throw invalid("expired");
  const request = challenge.request as Record<string, unknown>;
  const details = (request["methodDetails"] ?? {}) as Record<string, unknown>;
  if (details["sessionProtocol"] !== "v2") throw invalid("not a TIP-1034 (sessionProtocol v2) session");
  const chainId = details["chainId"];
  if (typeof chainId !== "number" || !Number.isSafeInteger(chainId)) throw invalid("no chainId");
  const escrow = address(details["escrowContract"]) ?? DEFAULT_ESCROW;
  if (!isAddressEqual(escrow, trustedEscrow)) throw invalid(`untrusted escrow ${escrow}`);
  const payee = address(request["recipient"]);
  const token = address(request["currency"]);
  if (!payee || !token) throw invalid("no recipient or currency");
  const amount = parseAmount(request["amount"]);
  if (amount === undefined || amount === 0n) throw invalid("no positive amount");
  const suggested = request["suggestedDeposit"];
  const suggestedDeposit = suggested === undefined ? undefined : parseAmount(suggested);
  if (suggested !== undefined && suggestedDeposit === undefined) throw invalid("malformed suggestedDeposit");
  return {
    challenge,
    amount,
    suggestedDeposit,
    chainId,
    escrow,
    payee,
    token,
    operator: address(details["operator"]) ?? ZERO_ADDRESS,
    feePayer: details["feePayer"] === true,
    feeToken: address(details["feeToken"]),
  };
}

function isSessionChallenge(challenge: Challenge.Challenge): boolean {
  const details = (challenge.request as { methodDetails?: { sessionProtocol?: unknown } }).methodDetails;
  return challenge.method === "tempo" && challenge.intent === "session" && details?.sessionProtocol === "v2";
}

/** The response's tempo/session v2 challenge; the body is consumed when it was not yet. */
async function takeChallenge(response: Response): Promise<Challenge.Challenge> {
  if (!response.bodyUsed) await response.body?.cancel();
  const challenge = challengeOf(response);
  if (!challenge) {
    throw new PaidSessionError(
      "challenge_invalid",
      `the ${response.status} carries no tempo/session (v2) payment challenge`,
      { status: response.status },
    );
  }
  return challenge;
}

/** The first tempo/session v2 challenge of `WWW-Authenticate`, if any (headers only). */
function challengeOf(response: Response): Challenge.Challenge | undefined {
  try {
    return Challenge.fromResponseList(response).find(isSessionChallenge);
  } catch {
    return undefined;
  }
}

/** Reads an error body as problem details (`code`, `type`, `detail`); never throws. */
async function readProblem(response: Response): Promise<Problem> {
  if (response.bodyUsed) return {};
  let text: string;
  try {
    text = await response.text();
  } catch {
    return {};
  }
  const body = parseJson(text) as Record<string, unknown> | undefined;
  if (!body || typeof body !== "object") return {};
  const nested = body["error"] as Record<string, unknown> | undefined;
  const problem: Problem = {};
  const code = body["code"] ?? nested?.["code"];
  if (typeof code === "string") problem.code = code;
  if (typeof body["type"] === "string") problem.type = body["type"];
  const detail = body["detail"] ?? nested?.["message"];
  if (typeof detail === "string") problem.detail = detail.slice(0, 300);
  return problem;
}

function problemSuffix(problem: Problem): string | undefined {
  return problem.type?.startsWith(PROBLEM_TYPE_PREFIX)
    ? problem.type.slice(PROBLEM_TYPE_PREFIX.length)
    : problem.type;
}

function problemDetails(status: number, problem: Problem) {
  const details: { status: number; serverCode?: string; problemType?: string } = { status };
  if (problem.code) details.serverCode = problem.code;
  if (problem.type) details.problemType = problem.type;
  return details;
}

function describe(problem: Problem): string {
  const name = problem.code ?? problemSuffix(problem);
  if (!name) return "";
  return problem.detail ? ` ${name}: ${problem.detail}` : ` ${name}`;
}

function expiresSoon(challenge: Challenge.Challenge): boolean {
  return challenge.expires !== undefined && Date.parse(challenge.expires) - CHALLENGE_SAFETY_MS <= Date.now();
}

function address(value: unknown): Address | undefined {
  return typeof value === "string" && isAddress(value, { strict: false }) ? value : undefined;
}

function parseAmount(value: unknown): bigint | undefined {
  return typeof value === "string" && /^(0|[1-9][0-9]{0,28})$/.test(value) ? BigInt(value) : undefined;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}
