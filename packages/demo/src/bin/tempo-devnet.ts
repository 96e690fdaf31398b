import { createTempoDevnet, DEMO_PAYEE_ADDRESS, DEMO_PAYER_ADDRESS } from "../tempo-devnet/index.js";

// A stand-alone Tempo devnet for the dev stack and manual runs:
//   PORT=18545 tsx packages/demo/src/bin/tempo-devnet.ts
// FEE_PER_TRANSACTION (base units, default 0) charges that fixed fee to each transaction's fee payer.

function integerFrom(name: string, fallback: bigint): bigint {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  if (!/^\d+$/.test(raw)) {
    console.error(`${name} must be a non-negative integer, got ${JSON.stringify(raw)}`);
    process.exit(1);
  }
  return BigInt(raw);
}

const devnet = await createTempoDevnet({
  host: process.env["HOST"] || "127.0.0.1",
  port: Number(integerFrom("PORT", 18545n)),
  feePerTransaction: integerFrom("FEE_PER_TRANSACTION", 0n),
});
const units = (amount: bigint) =>
  `${amount / 1_000_000n}.${(amount % 1_000_000n).toString().padStart(6, "0")}`;

console.log(`tempo devnet listening on ${devnet.url}`);
console.log(`  chain id        ${devnet.chainId}`);
console.log(`  token (USDC.e)  ${devnet.token} (6 decimals)`);
console.log(`  escrow          ${devnet.escrow} (TIP-1034 channel reserve)`);
console.log(`  fee per tx      ${units(devnet.feePerTransaction)} in the tx's fee token`);
console.log(`  demo payer      ${DEMO_PAYER_ADDRESS} holds ${units(devnet.balanceOf(DEMO_PAYER_ADDRESS))}`);
console.log(`  demo payee      ${DEMO_PAYEE_ADDRESS} holds ${units(devnet.balanceOf(DEMO_PAYEE_ADDRESS))}`);
console.log("A payer pays with the demo payer key: DEMO_PAYER_PRIVATE_KEY in");
console.log("packages/demo/src/tempo-devnet/demo-accounts.ts (dev only; never use it on a real chain).");

let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  devnet.close().then(
    () => process.exit(0),
    () => process.exit(1),
  );
};
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
