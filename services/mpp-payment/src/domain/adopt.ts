import { MAX_AMOUNT } from "./amounts.js";
import { failed, type PaymentContext } from "./context.js";
import { checkSource } from "./credential.js";
import type { ChannelRecord } from "./ports.js";
import { channelTag } from "./safe-log.js";
import type { SessionPayload } from "./session-payload.js";

/**
 * The stored channel, or one adopted from the chain when the store does not know it (another
 * replica's memory store, a lost record): it must be live on chain. Spend recorded before is
 * unknown then, so it starts at what is settled.
 */
export async function loadOrAdopt(
  ctx: PaymentContext,
  p: SessionPayload,
  source: string | undefined,
): Promise<ChannelRecord> {
  const { store, log } = ctx;
  const stored = await store.get(p.channelId);
  if (stored) return stored;
  checkSource(ctx, source, p);
  const state = await ctx.chainState(p.channelId, true);
  if (state.deposit === 0n || state.closeRequestedAt !== 0) throw failed("channel is not open on chain");
  await store.create({
    channelId: p.channelId,
    descriptor: p.descriptor,
    deposit: state.deposit > MAX_AMOUNT ? MAX_AMOUNT : state.deposit,
    settled: state.settled,
    voucher: { cumulative: state.settled, signature: "0x" },
  });
  log.info({ channel: channelTag(p.channelId) }, "channel adopted from chain");
  const adopted = await store.get(p.channelId);
  if (!adopted) throw failed("channel could not be recorded");
  return adopted;
}
