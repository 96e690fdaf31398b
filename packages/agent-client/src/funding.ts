import type { ChannelState } from "./channel.js";
import type { Exchange } from "./exchange.js";
import { describe, problemDetails } from "./problem.js";
import { checkReceipt, RECEIPT_HEADER } from "./receipts.js";
import type { Signer } from "./signing.js";
import type { SessionTerms } from "./terms.js";
import { PaidSessionError, type PaidSessionEvent } from "./types.js";

/** What raising a voucher or topping up a channel works with. */
export interface Funding {
  exchange: Exchange;
  signer: Signer;
  maxDeposit: bigint | undefined;
  emit: (event: PaidSessionEvent) => void;
}

/**
 * Signs the next voucher (by default cumulative + amount), topping the channel up first when it
 * would exceed the deposit.
 */
export async function raiseVoucher(
  f: Funding,
  channel: ChannelState,
  terms: SessionTerms,
  next = channel.cumulativeAmount + terms.amount,
  reason = "refresh required",
): Promise<void> {
  if (f.maxDeposit !== undefined && next > f.maxDeposit) {
    throw new PaidSessionError(
      "max_deposit_exceeded",
      `the next voucher (${next}) would exceed maxDeposit (${f.maxDeposit}); close the session or raise the cap`,
      { channelId: channel.channelId },
    );
  }
  if (next > channel.deposit) await topUpFor(f, channel, terms, next, "next voucher exceeds the deposit");
  const signature = await f.signer.voucher(channel, next);
  f.emit({ type: "raise", from: channel.cumulativeAmount, to: next, reason });
  channel.cumulativeAmount = next;
  channel.signature = signature;
}

/**
 * Tops the channel up so that it covers `required` (or, when 0, by one suggested deposit):
 * mppx's sizing, max(suggestedDeposit, shortfall) capped by maxDeposit.
 */
export async function topUpFor(
  f: Funding,
  channel: ChannelState,
  terms: SessionTerms,
  required: bigint,
  reason: string,
): Promise<void> {
  const shortfall = required > channel.deposit ? required - channel.deposit : terms.amount;
  const preferred = terms.suggestedDeposit ?? shortfall;
  let additional = preferred > shortfall ? preferred : shortfall;
  if (f.maxDeposit !== undefined) {
    const room = f.maxDeposit - channel.deposit;
    if (room < shortfall || room <= 0n) {
      throw new PaidSessionError(
        "max_deposit_exceeded",
        `a top-up of ${shortfall} would take the deposit (${channel.deposit}) over maxDeposit (${f.maxDeposit})`,
        { channelId: channel.channelId },
      );
    }
    if (additional > room) additional = room;
  }
  const transaction = await f.signer.topUp(channel, terms, additional);
  const payload = {
    action: "topUp",
    type: "transaction",
    channelId: channel.channelId,
    transaction,
    descriptor: channel.descriptor,
    additionalDeposit: additional.toString(),
  };
  const { response, problem } = await f.exchange.postManagement(terms.challenge, payload, channel);
  f.emit({
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
  if (header) checkReceipt(header, channel);
}
