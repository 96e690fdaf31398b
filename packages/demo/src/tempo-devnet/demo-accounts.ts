import type { Address, Hex } from "viem";

// DEV ONLY. These keys are public: they are committed to the repository so that the dev stack,
// the demo and the tests share deterministic accounts on the local Tempo devnet. Never fund
// them, or use them, on a real chain.

/** DEV ONLY: private key of the demo payer (an mppx client pays the paid door with it). */
export const DEMO_PAYER_PRIVATE_KEY: Hex =
  "0x87bc52fb67814ab6ba36101a33aa342f7af31b5d79caf50492008c49d73863ff";

/** Address of the demo payer. */
export const DEMO_PAYER_ADDRESS: Address = "0x4a1Ba38C07f6dE670D6C1E730f269acfed2a11e0";

/** DEV ONLY: private key of the demo payee (the gateway's payee; it sends settle and close). */
export const DEMO_PAYEE_PRIVATE_KEY: Hex =
  "0x0e83644898daf21f4eced55d6afa70f290a3630935d73f3f41611fae3eb0f099";

/** Address of the demo payee. */
export const DEMO_PAYEE_ADDRESS: Address = "0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e";

/** Default demo payer funding: 1000 tokens (6 decimals). */
export const DEMO_PAYER_FUNDING = 1_000_000_000n;

/** Default demo payee funding: 10 tokens, enough fee token for its settle and close transactions. */
export const DEMO_PAYEE_FUNDING = 10_000_000n;
