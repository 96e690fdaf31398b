import type { Address } from "viem";

/** What the payment domain is configured with; app.ts builds it from the start() options. */
export interface PaymentSettings {
  /** Challenge realm. */
  realm: string;
  /** HMAC key of challenge ids (≥ 32 bytes), shared by every replica. */
  secret: string;
  chainId: number;
  /** The TIP-20 token sessions pay in (USDC.e on Tempo mainnet). */
  currency: Address;
  /** The TIP-1034 channel reserve precompile. */
  escrow: Address;
  /** The payee every channel must name. */
  recipient: Address;
  /** The challenge amount: the cumulative voucher bucket, base units. */
  bucket: bigint;
  /** suggestedDeposit of the challenge, base units; a hint, never a minimum. */
  suggestedDeposit: bigint;
  challengeTtlSeconds: number;
  /** When set, only these payers may pay (compared case-insensitively). */
  payerAllowlist?: readonly Address[];
  /** Largest Authorization header accepted, in bytes. */
  maxCredentialBytes: number;
  /** How long a hold lives if it is neither committed nor released. */
  reservationTtlSeconds: number;
}
