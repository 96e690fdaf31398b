import type { Challenge } from "mppx";
import type { Address, Hex, LocalAccount } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import {
  assertSameChannel,
  type ChannelState,
  channelFromState,
  channelToState,
  voucherPayload,
} from "./channel.js";
import { closeChannel } from "./close.js";
import { Exchange } from "./exchange.js";
import { type Funding, raiseVoucher, topUpFor } from "./funding.js";
import { describe, nextStep, problemDetails, problemSuffix, readProblem } from "./problem.js";
import { acceptReceipt, acknowledgesOpen } from "./receipts.js";
import { Signer } from "./signing.js";
import { type SessionTerms, takeChallenge } from "./terms.js";
import {
  type CloseResult,
  DEFAULT_ESCROW,
  DEFAULT_MAX_ATTEMPTS,
  MPP_CHAT_PATH,
  type PaidAttempt,
  type PaidResponse,
  PaidSessionError,
  type PaidSessionEvent,
  type PaidSessionOptions,
  type PaidSessionState,
  type VoucherAction,
} from "./types.js";
import { parseJson } from "./values.js";

export { openingDeposit } from "./channel.js";
export * from "./types.js";

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
  readonly #maxDeposit: bigint | undefined;
  readonly #maxAttempts: number;
  readonly #exchange: Exchange;
  readonly #signer: Signer;
  readonly #funding: Funding;
  readonly #onEvent: ((event: PaidSessionEvent) => void) | undefined;
  readonly #voucherEachRequest: boolean;
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
    this.#maxDeposit = options.maxDeposit;
    this.#maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULT_MAX_ATTEMPTS);
    const trustedEscrow: Address = options.escrow ?? DEFAULT_ESCROW;
    this.#exchange = new Exchange(this.url, {
      payer: this.payer,
      trustedEscrow,
      timeoutMs: options.timeoutMs ?? 120_000,
      fetch: options.fetch ?? globalThis.fetch,
    });
    this.#signer = new Signer(this.#account, options.rpcUrl);
    this.#onEvent = options.onEvent;
    this.#voucherEachRequest = options.voucherEachRequest ?? false;
    this.#funding = {
      exchange: this.#exchange,
      signer: this.#signer,
      maxDeposit: this.#maxDeposit,
      emit: (event) => this.#emit(event),
    };
    if (options.state) {
      this.#channel = channelFromState(options.state, { url: this.url, trustedEscrow, payer: this.payer });
    }
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
    return channelToState(this.url, channel);
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
    const unpaid = await this.#exchange.post(bodyText);
    if (unpaid.status !== 402) {
      const problem = await readProblem(unpaid);
      throw new PaidSessionError(
        unpaid.ok ? "unexpected_status" : "http_error",
        `expected a 402 payment challenge for the unpaid request, got ${unpaid.status}${describe(problem)}`,
        problemDetails(unpaid.status, problem),
      );
    }
    let terms = this.#exchange.terms(await takeChallenge(unpaid));
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
        assertSameChannel(this.#channel, terms);
        if (mode === "raise") {
          await raiseVoucher(this.#funding, this.#channel, terms);
          raised = true;
          action = "raise";
        } else if (this.#voucherEachRequest && attemptNo === 1) {
          // The spend so far plus one amount: a higher voucher each request, never far above the spend.
          const c = this.#channel;
          const floor = c.spent + terms.amount;
          const next = floor > c.cumulativeAmount ? floor : c.cumulativeAmount + 1n;
          await raiseVoucher(this.#funding, c, terms, next, "a new voucher for each request");
          raised = true;
          action = "raise";
        } else action = "reuse";
      }
      const channel = this.#channel!;
      const payload =
        action === "open" ? this.#pendingOpen! : voucherPayload(channel, "voucher", channel.signature);
      const response = await this.#exchange.post(
        bodyText,
        terms.challenge,
        this.#exchange.credential(terms, payload),
      );
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
        const receipt = acceptReceipt(response, channel);
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

      if (action === "open" && acknowledgesOpen(response, channel)) {
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
      terms = this.#exchange.terms(await takeChallenge(response));
      if (next === "raise") mode = "raise";
      else {
        mode = "reuse";
        if (next === "top-up") {
          await topUpFor(
            this.#funding,
            channel,
            terms,
            channel.cumulativeAmount,
            code ?? "deposit below request cost",
          );
        }
      }
    }
    throw new PaidSessionError(
      "retries_exhausted",
      `still not paid after ${this.#maxAttempts} paid attempts (${attempts.map((a) => `${a.action}:${a.status}${a.code ? `:${a.code}` : ""}`).join(", ")})`,
    );
  }

  /** Builds and signs the open transaction and the first voucher (cumulative = amount). */
  /** Builds and signs the open transaction and the first voucher (cumulative = amount). */
  async #open(terms: SessionTerms): Promise<void> {
    const { channel, payload } = await this.#signer.open(terms, this.#maxDeposit);
    this.#channel = channel;
    this.#pendingOpen = payload;
    this.#emit({
      type: "open",
      channelId: channel.channelId,
      deposit: channel.deposit,
      cumulativeAmount: channel.cumulativeAmount,
      chainId: terms.chainId,
    });
  }

  async #close(probeBody: Record<string, unknown> | undefined): Promise<CloseResult | undefined> {
    const channel = this.#channel;
    if (!channel || this.#closed) return undefined;
    const result = await closeChannel(
      this.#exchange,
      channel,
      this.#lastChallenge,
      () => (probeBody ? JSON.stringify(probeBody) : this.#lastBody),
      (event) => this.#emit(event),
    );
    this.#closed = true;
    return result;
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
