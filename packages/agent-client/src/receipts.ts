import { Session } from "mppx/tempo";
import type { ChannelState } from "./channel.js";
import { PaidSessionError, type SessionReceipt } from "./types.js";
import { parseAmount } from "./values.js";

const { deserializeSessionReceipt } = Session.Precompile.Receipt;

export const RECEIPT_HEADER = "Payment-Receipt";

/** spent <= acceptedCumulative <= the local cumulative, on this channel (mppx's client rule). */
export function checkReceipt(header: string, channel: ChannelState): SessionReceipt {
  let receipt: SessionReceipt;
  try {
    receipt = deserializeSessionReceipt(header);
  } catch (error) {
    throw new PaidSessionError("receipt_invalid", `unreadable Payment-Receipt: ${(error as Error).message}`, {
      channelId: channel.channelId,
    });
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

/** Validates a content response's receipt against the local voucher state and records `spent`. */
export function acceptReceipt(response: Response, channel: ChannelState): SessionReceipt {
  const header = response.headers.get(RECEIPT_HEADER);
  if (!header) {
    throw new PaidSessionError(
      "receipt_missing",
      `the paid request answered ${response.status} without a Payment-Receipt: a failed payment path (spec, MPP route rule 5)`,
      { status: response.status, channelId: channel.channelId },
    );
  }
  return checkReceipt(header, channel);
}

/**
 * Whether a failed answer to the open carries a receipt of that open: this channel, at the
 * opened voucher (as mppx 0.11 keeps a channel whose non-2xx answer has a receipt).
 */
export function acknowledgesOpen(response: Response, channel: ChannelState): boolean {
  const header = response.headers.get(RECEIPT_HEADER);
  if (!header) return false;
  try {
    return checkReceipt(header, channel).acceptedCumulative === channel.cumulativeAmount.toString();
  } catch {
    return false;
  }
}
