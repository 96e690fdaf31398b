import { type Address, maxUint256 } from "viem";
import { tempo } from "viem/chains";

/** Tempo mainnet chain id; the devnet answers as this chain so the gateway config is unchanged. */
export const TEMPO_CHAIN_ID = tempo.id;

/** USDC.e on Tempo mainnet: the default session currency and the devnet's default fee token. */
export const USDC_E: Address = "0x20C000000000000000000000b9537d11c60E8b50";

/** pathUSD, the other TIP-20 stablecoin the devnet knows. */
export const PATH_USD: Address = "0x20c0000000000000000000000000000000000000";

/** The TIP-1034 TIP-20 channel reserve precompile (session escrow, protocol v2). */
export const CHANNEL_RESERVE: Address = "0x4d50500000000000000000000000000000000000";

/** Tempo's fee manager precompile; the devnet credits collected fees here. */
export const FEE_MANAGER: Address = "0xfeec000000000000000000000000000000000000";

/** Every TIP-20 token has 6 decimals. */
export const TOKEN_DECIMALS = 6;

/** Seconds between a payer's requestClose and the earliest withdraw (TIP-1034). */
export const CLOSE_GRACE_PERIOD = 900n;

/** TIP-1009: an expiring-nonce transaction's validBefore may be at most this far after the block time. */
export const MAX_VALID_BEFORE_WINDOW = 30n;

/** TIP-1009: the nonce key that marks an expiring-nonce transaction. */
export const EXPIRING_NONCE_KEY = maxUint256;

/** Fixed base fee reported by blocks and fee RPCs (attodollars per gas, like Tempo's 18-decimal gas price). */
export const BASE_FEE_PER_GAS = 20_000_000_000n;

/** Block gas limit reported in block headers. */
export const BLOCK_GAS_LIMIT = 500_000_000n;

/** The TIP-20 tokens the devnet executes, with their metadata. */
export const KNOWN_TOKENS: ReadonlyArray<{ address: Address; name: string; symbol: string }> = [
  { address: USDC_E, name: "Bridged USDC (Stargate)", symbol: "USDC.e" },
  { address: PATH_USD, name: "pathUSD", symbol: "pathUSD" },
];

/** The token metadata for an address, when the devnet knows it. */
export function knownToken(
  address: string | undefined,
): { address: Address; name: string; symbol: string } | undefined {
  if (address === undefined) return undefined;
  const lower = address.toLowerCase();
  return KNOWN_TOKENS.find((token) => token.address.toLowerCase() === lower);
}

/** Case-insensitive address equality. */
export function sameAddress(a: string | undefined, b: string | undefined): boolean {
  return a !== undefined && b !== undefined && a.toLowerCase() === b.toLowerCase();
}
