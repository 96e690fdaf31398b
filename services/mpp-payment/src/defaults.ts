import type { Address } from "viem";

/**
 * Defaults of the first production rollout (docs/paid-door.md: chain 4217, USDC.e, the
 * TIP-1034 escrow).
 */
export const DEFAULTS = {
  realm: "tollgate",
  chainId: 4217,
  /** USDC.e on Tempo mainnet. */
  currency: "0x20C000000000000000000000b9537d11c60E8b50" as Address,
  /** The TIP-1034 channel reserve precompile. */
  escrow: "0x4d50500000000000000000000000000000000000" as Address,
  /** 1 token unit: the cumulative voucher bucket (challenge amount). */
  voucherBucket: 1_000_000n,
  /** 5 token units: a reusable-session hint, not a minimum. */
  suggestedDeposit: 5_000_000n,
  challengeTtlSeconds: 300,
  // Below Node's 16 KiB limit on all request headers together, so the check is reachable over HTTP.
  maxCredentialBytes: 8_192,
  settleIntervalSeconds: 60,
  /**
   * A hold neither committed nor released is dropped after this long. It must outlast the
   * slowest buffered inference (upstream timeouts default to 120 s), or a served request would
   * find its hold gone and answer mpp_commit_failed.
   */
  reservationTtlSeconds: 300,
  /**
   * One chain JSON-RPC request is abandoned after this long and retried at most 3 times
   * (200/400/800 ms apart), so a chain that stops answering fails one request within about
   * 4 × 5 + 1.4 = 21.4 s: inside api-edge's 30 s payment deadline.
   */
  rpcTimeoutMs: 5_000,
  redisPrefix: "tollgate:",
} as const;
