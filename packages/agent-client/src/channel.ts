import { Session } from "mppx/tempo";
import { type Address, type Hex, isAddressEqual } from "viem";
import type { SessionTerms } from "./terms.js";
import { type ChannelDescriptor, PaidSessionError, type PaidSessionState } from "./types.js";
import { parseAmount } from "./values.js";

const { Channel, Voucher } = Session.Precompile;

/** The payer's record of its open channel and current voucher. */
export interface ChannelState {
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

/** The channel and voucher as JSON, to resume or close the session from another process. */
export function channelToState(url: string, channel: ChannelState): PaidSessionState {
  return {
    version: 1,
    url,
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

/** Resumes a channel from saved state, after checking it belongs to this route, escrow and payer. */
export function channelFromState(
  state: PaidSessionState,
  expected: { url: string; trustedEscrow: Address; payer: Address },
): ChannelState {
  const invalid = (why: string) => new PaidSessionError("state_invalid", `session state: ${why}`);
  if (state.version !== 1) throw invalid(`unknown version ${String(state.version)}`);
  if (state.url !== expected.url) throw invalid(`it belongs to ${state.url}, not ${expected.url}`);
  if (!isAddressEqual(state.escrow, expected.trustedEscrow)) throw invalid("untrusted escrow");
  if (!isAddressEqual(state.descriptor.payer, expected.payer))
    throw invalid("the payer is not this key's address");
  const computed = Channel.computeId({ ...state.descriptor, chainId: state.chainId, escrow: state.escrow });
  if (computed.toLowerCase() !== state.channelId.toLowerCase()) throw invalid("channelId does not match");
  const amounts = [state.deposit, state.cumulativeAmount, state.spent, state.acceptedCumulative].map(
    parseAmount,
  );
  if (amounts.some((amount) => amount === undefined)) throw invalid("malformed amounts");
  const [deposit, cumulativeAmount, spent, acceptedCumulative] = amounts as [bigint, bigint, bigint, bigint];
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

/** A voucher only pays for the channel's own payee, token, chain and escrow. */
export function assertSameChannel(channel: ChannelState | undefined, terms: SessionTerms): void {
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

/** The credential payload of a voucher or close on this channel. */
export function voucherPayload(channel: ChannelState, action: "voucher" | "close", signature: Hex) {
  return {
    action,
    channelId: channel.channelId,
    descriptor: channel.descriptor,
    cumulativeAmount: channel.cumulativeAmount.toString(),
    signature,
  };
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
