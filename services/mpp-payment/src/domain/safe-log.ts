import { createHash } from "node:crypto";

/**
 * A short, stable, non-reversible tag of a channel id for log lines: enough to correlate lines
 * of one channel, never the id itself (docs/contract.md, "Authentication", rule 4 keeps payment material out
 * of logs; the id reveals the payer's channel on chain).
 */
export function channelTag(channelId: string): string {
  return createHash("sha256").update(channelId.toLowerCase()).digest("hex").slice(0, 12);
}

/**
 * What may be logged of a failure from the chain or a library: its class name and a short
 * reason with every long hex string (addresses, hashes, signatures, raw transactions) cut out.
 * viem errors carry request bodies with signed transactions; they are never logged whole.
 */
export function safeCause(err: unknown): { name: string; reason: string } {
  const e = (typeof err === "object" && err !== null ? err : {}) as {
    name?: unknown;
    shortMessage?: unknown;
    reason?: unknown;
    message?: unknown;
  };
  const text = [e.reason, e.shortMessage, e.message, String(err)].find(
    (v): v is string => typeof v === "string" && v !== "",
  );
  const reason = (text ?? "unknown")
    .split("\n")[0]!
    .replace(/0x[0-9a-fA-F]{8,}/g, "0x…")
    .replace(/[A-Za-z0-9_-]{40,}/g, "…")
    .slice(0, 200);
  return { name: typeof e.name === "string" ? e.name : "Error", reason };
}
