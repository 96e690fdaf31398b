import type { Challenge } from "mppx";
import type { Hex } from "viem";
import { assertSameChannel, type ChannelState, voucherPayload } from "./channel.js";
import type { Exchange } from "./exchange.js";
import { describe, problemDetails, readProblem } from "./problem.js";
import { checkReceipt, RECEIPT_HEADER } from "./receipts.js";
import { expiresSoon, takeChallenge } from "./terms.js";
import { type CloseResult, PaidSessionError, type PaidSessionEvent } from "./types.js";

/**
 * Closes the channel with its current cumulative voucher and checks the close receipt. `challenge`
 * is the session's last one; when there is none or it expires soon, the body `probeBody` gives is
 * sent unpaid for a fresh one.
 */
export async function closeChannel(
  exchange: Exchange,
  channel: ChannelState,
  lastChallenge: Challenge.Challenge | undefined,
  probeBody: () => string | undefined,
  emit: (event: PaidSessionEvent) => void,
): Promise<CloseResult> {
  let challenge = lastChallenge;
  if (!challenge || expiresSoon(challenge)) {
    const body = probeBody();
    if (!body) {
      throw new PaidSessionError(
        "challenge_invalid",
        "no challenge to close with: pass probeBody (an unpaid request body) to close()",
      );
    }
    const probe = await exchange.post(body);
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
  const terms = exchange.terms(challenge);
  assertSameChannel(channel, terms);
  // The close voucher is the current cumulative voucher: same amount, same (deterministic) signature.
  const payload = voucherPayload(channel, "close", channel.signature);
  const { response, problem, challenge: used } = await exchange.postManagement(challenge, payload, channel);
  emit({
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
  const receipt = checkReceipt(header, channel);
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
  return {
    channelId: channel.channelId,
    cumulativeAmount: channel.cumulativeAmount,
    spent,
    deposit: channel.deposit,
    txHash: receipt.txHash as Hex,
    receipt,
  };
}
