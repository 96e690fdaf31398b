import { Session } from "mppx/tempo";
import type { Hex } from "viem";

/** The figures a session receipt reports (the MPP session receipt fields the mppx client reads). */
export interface ReceiptFigures {
  challengeId: string;
  channelId: Hex;
  acceptedCumulative: bigint;
  spent: bigint;
  units?: number;
  txHash?: Hex;
  /** When the reported state was reached; a repeated commit reports the first commit's time. */
  at: number;
}

/**
 * The Payment-Receipt header value: mppx's session receipt (method tempo, intent session,
 * status success, reference = channel id, lowercase channel id), base64url JSON.
 */
export function sessionReceipt(f: ReceiptFigures): string {
  const receipt = Session.Precompile.Receipt.createSessionReceipt({
    challengeId: f.challengeId,
    channelId: f.channelId.toLowerCase() as Hex,
    acceptedCumulative: f.acceptedCumulative,
    spent: f.spent,
    ...(f.units === undefined ? {} : { units: f.units }),
    ...(f.txHash === undefined ? {} : { txHash: f.txHash }),
  });
  return Session.Precompile.Receipt.serializeSessionReceipt({
    ...receipt,
    timestamp: new Date(f.at).toISOString(),
  });
}
