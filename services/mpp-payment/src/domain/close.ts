import { retrying } from "@tollgate/kit/retry";
import type { Hex } from "viem";
import { loadOrAdopt } from "./adopt.js";
import { maxOf } from "./amounts.js";
import { failed, type PaymentContext } from "./context.js";
import { authenticate, type CredentialedRequest, checkSignature, checkSource } from "./credential.js";
import { PaymentError } from "./errors.js";
import type { BeginCloseOutcome, ChannelRecord, OnChainState } from "./ports.js";
import { sessionReceipt } from "./receipts.js";
import { channelTag, safeCause } from "./safe-log.js";
import type { SessionPayload } from "./session-payload.js";

/** "close" pre-checks: signer from the stored descriptor, amount not below the spend. */
export async function checkClose(
  ctx: PaymentContext,
  p: Extract<SessionPayload, { action: "close" }>,
  source: string | undefined,
) {
  const record = await loadOrAdopt(ctx, p, source);
  if (record.status === "closed") return record;
  checkSource(ctx, source, record);
  await checkSignature(ctx, p.channelId, p.cumulativeAmount, p.signature, record);
  if (p.cumulativeAmount < maxOf(record.spent, record.settled)) {
    throw failed("close amount is below the channel's spent amount");
  }
  return record;
}

function closedReceipt(
  ctx: PaymentContext,
  record: ChannelRecord,
  cumulative: bigint,
  challengeId: string,
): string {
  if (!record.closed || record.closed.cumulative !== cumulative) throw failed("channel is already closed");
  return sessionReceipt({
    challengeId,
    channelId: record.channelId,
    acceptedCumulative: record.closed.cumulative,
    spent: record.closed.captured,
    units: record.units,
    txHash: record.closed.txHash,
    at: ctx.now(),
  });
}

/** What a close waiting for the channel's holds is told while some are still live. */
const BUSY = Symbol("busy");

/**
 * Marks the channel closing once no hold is live, waiting for that at most `closeWaitMs`: a
 * request answered just before the close may still have its Commit on the way (api-edge sends
 * it after the answer, docs/paid-door.md, "One round trip"), and the close must capture it. A
 * hold still live after the wait (a request still running) answers `busy`.
 */
async function beginCloseWhenSettled(ctx: PaymentContext, channelId: Hex): Promise<BeginCloseOutcome> {
  return retrying(
    async () => {
      const begun = await ctx.store.beginClose(channelId, ctx.now(), ctx.staleCloseMs);
      if (begun.kind === "busy") throw BUSY;
      return begun;
    },
    (err) => err === BUSY,
    { delayMs: 10, maxDelayMs: 200, forMs: ctx.closeWaitMs },
  ).catch((err: unknown) => {
    if (err === BUSY) return { kind: "busy" } as const;
    throw err;
  });
}

/** Closes the channel on chain from a close credential; returns the close receipt. */
export async function close(ctx: PaymentContext, req: CredentialedRequest): Promise<string> {
  const { store, chain, log } = ctx;
  const { verified, payload: p, source } = authenticate(ctx, { ...req, body: new Uint8Array() });
  if (p.action !== "close") throw failed("not a close credential");
  const challengeId = verified.id;
  const tag = channelTag(p.channelId);
  const cumulative = p.cumulativeAmount;
  const checked = await checkClose(ctx, p, source);
  if (checked.status === "closed") return closedReceipt(ctx, checked, cumulative, challengeId);
  if (!chain.canSend) {
    throw new PaymentError(
      "mpp_session_close_unavailable",
      "the close signer is not configured; the session stays open",
    );
  }
  let begun: BeginCloseOutcome;
  try {
    begun = await beginCloseWhenSettled(ctx, p.channelId);
  } catch (err) {
    log.error({ channel: tag, err }, "close mark failed");
    throw new PaymentError(
      "mpp_session_close_unavailable",
      "the close recorder is unreachable; the session stays open",
      {
        cause: err,
      },
    );
  }
  switch (begun.kind) {
    case "ok":
      break;
    case "closed": {
      const record = await store.get(p.channelId);
      if (!record) throw failed("channel is unknown");
      return closedReceipt(ctx, record, cumulative, challengeId);
    }
    case "closing":
      throw new PaymentError("mpp_session_close_failed", "a close of this session is already in flight");
    case "busy":
      throw new PaymentError("mpp_session_close_failed", "requests of this session are still in flight");
    case "unknown":
      throw failed("channel is unknown");
  }
  const { token, record } = begun;
  const abort = async (error: PaymentError) => {
    await store.abortClose(p.channelId, token).catch((err: unknown) => {
      log.error({ channel: tag, err }, "close rollback failed");
    });
    return error;
  };
  let capture = maxOf(record.spent, record.settled);
  if (cumulative < capture) throw await abort(failed("close amount is below the channel's spent amount"));
  let state: OnChainState;
  try {
    state = await chain.state(p.channelId);
  } catch (err) {
    log.warn({ channel: tag, cause: safeCause(err) }, "channel state read failed");
    throw await abort(
      new PaymentError("mpp_session_close_failed", "channel state could not be read from the chain"),
    );
  }
  capture = maxOf(capture, state.settled);
  if (state.deposit === 0n || capture > state.deposit || capture > cumulative) {
    throw await abort(
      new PaymentError("mpp_session_close_failed", "the channel cannot be closed at this amount"),
    );
  }
  let closed: { txHash: Hex; settledToPayee: bigint; refundedToPayer: bigint };
  try {
    closed = await chain.close(
      record.descriptor,
      p.channelId,
      { cumulative, signature: p.signature },
      capture,
    );
  } catch (err) {
    log.warn({ channel: tag, cause: safeCause(err) }, "close transaction failed");
    throw await abort(
      new PaymentError("mpp_session_close_failed", "the close transaction failed", { cause: err }),
    );
  }
  ctx.forgetState(p.channelId);
  if (closed.settledToPayee > capture || closed.settledToPayee + closed.refundedToPayer > state.deposit) {
    log.error({ channel: tag }, "close event amounts differ from the requested capture");
  }
  try {
    await store.finishClose(p.channelId, {
      txHash: closed.txHash,
      cumulative,
      captured: closed.settledToPayee,
    });
  } catch (err) {
    log.error({ channel: tag, err }, "close record failed after the close transaction");
    throw new PaymentError("mpp_session_close_failed", "the close was sent but could not be recorded", {
      cause: err,
    });
  }
  await store.clearDirty(p.channelId).catch(() => undefined);
  log.info({ channel: tag }, "channel closed");
  return sessionReceipt({
    challengeId,
    channelId: p.channelId,
    acceptedCumulative: cumulative,
    spent: closed.settledToPayee,
    units: record.units,
    txHash: closed.txHash,
    at: ctx.now(),
  });
}
