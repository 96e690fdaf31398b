import { type Address, type Hex, hexToBigInt, isHex, numberToHex, zeroAddress, zeroHash } from "viem";
import { Transaction } from "viem/tempo";
import {
  type DevnetBlock,
  type DevnetChain,
  type DevnetLog,
  type DevnetReceipt,
  type DevnetTransaction,
  gasFor,
  type RpcCallRequest,
  RpcError,
} from "./chain.js";
import { BASE_FEE_PER_GAS, BLOCK_GAS_LIMIT, EXPIRING_NONCE_KEY, knownToken, USDC_E } from "./constants.js";

// JSON-RPC surface of the devnet: the subset of Ethereum JSON-RPC (plus Tempo's
// eth_fillTransaction and eth_sendRawTransactionSync) that viem, the mppx client, the mppx
// reference server and the gateway's chain adapter use. Unknown methods answer -32601.

const ZERO_BLOOM: Hex = `0x${"00".repeat(256)}`;
const EMPTY_UNCLES_HASH: Hex = "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347";
const DEFAULT_SYNC_TIMEOUT_MS = 30_000;

type Handler = (chain: DevnetChain, params: unknown[]) => unknown | Promise<unknown>;

const quantity = (value: bigint | number): Hex => numberToHex(value);

/** The JSON-RPC methods the devnet answers. */
export const methods: Record<string, Handler> = {
  web3_clientVersion: () => "tollgate-tempo-devnet/0.1.0",
  net_version: (chain) => String(chain.chainId),
  net_listening: () => true,
  eth_chainId: (chain) => quantity(chain.chainId),
  eth_syncing: () => false,
  eth_accounts: () => [],
  eth_blockNumber: (chain) => quantity(chain.latest.number),
  eth_gasPrice: () => quantity(BASE_FEE_PER_GAS),
  eth_maxPriorityFeePerGas: () => "0x0",
  eth_feeHistory: (chain, params) => feeHistory(chain, params),
  eth_getBlockByNumber: (chain, [tag, full]) => {
    const block = chain.block(blockNumberOf(chain, tag));
    return block ? formatBlock(chain, block, full === true) : null;
  },
  eth_getBlockByHash: (chain, [hash, full]) => {
    const block = chain.blockByHash(asHex(hash, "block hash"));
    return block ? formatBlock(chain, block, full === true) : null;
  },
  eth_getBlockTransactionCountByNumber: (chain, [tag]) => {
    const block = chain.block(blockNumberOf(chain, tag));
    return block ? quantity(block.transactions.length) : null;
  },
  eth_getTransactionCount: (chain, [address, tag]) => {
    const account = asAddress(address);
    if (tag === "pending") return quantity(chain.nextNonce(account, 0n));
    return quantity(chain.stateAt(blockNumberOf(chain, tag)).nonce(account, 0n));
  },
  // Tempo has no native coin; like a Tempo node, report the default fee token's balance scaled
  // to 18 decimals so balance checks in generic tooling see a funded account.
  eth_getBalance: (chain, [address, tag]) =>
    quantity(chain.stateAt(blockNumberOf(chain, tag)).balanceOf(USDC_E, asAddress(address)) * 10n ** 12n),
  eth_getCode: (_chain, [address]) => {
    const target = asAddress(address);
    // System contracts and TIP-20 tokens are precompiles; Tempo marks them with a 0xef byte.
    return knownToken(target) || isSystemAddress(target) ? "0xef" : "0x";
  },
  eth_call: (chain, [request, tag]) => chain.simulate(asCallRequest(request), blockNumberOf(chain, tag)),
  eth_estimateGas: (chain, [request, tag]) => {
    const call = asCallRequest(request);
    chain.simulate(call, blockNumberOf(chain, tag));
    return quantity(gasFor(call.calls?.length ?? 1));
  },
  eth_fillTransaction: (chain, [request]) => fillTransaction(chain, asCallRequest(request)),
  eth_sendRawTransaction: (chain, [raw]) => chain.submit(asHex(raw, "raw transaction")),
  eth_sendRawTransactionSync: async (chain, [raw, timeout]) => {
    const hash = chain.submit(asHex(raw, "raw transaction"));
    const timeoutMs = typeof timeout === "number" ? timeout : DEFAULT_SYNC_TIMEOUT_MS;
    return formatReceipt(await chain.waitForReceipt(hash, timeoutMs));
  },
  eth_getTransactionReceipt: (chain, [hash]) => {
    const receipt = chain.receipt(asHex(hash, "transaction hash"));
    return receipt ? formatReceipt(receipt) : null;
  },
  eth_getTransactionByHash: (chain, [hash]) => {
    const tx = chain.transaction(asHex(hash, "transaction hash"));
    return tx ? formatTransaction(tx) : null;
  },
  eth_getLogs: (chain, [filter]) => getLogs(chain, (filter ?? {}) as LogFilter),
};

/** Answers one JSON-RPC request; errors come back as RpcError. */
export async function dispatch(chain: DevnetChain, method: string, params: unknown): Promise<unknown> {
  const handler = methods[method];
  if (!handler) throw new RpcError(-32601, `the method ${method} does not exist/is not available`);
  return handler(chain, Array.isArray(params) ? params : []);
}

function isSystemAddress(address: Address): boolean {
  const lower = address.toLowerCase();
  return (
    lower === "0x4d50500000000000000000000000000000000000" ||
    lower === "0xfeec000000000000000000000000000000000000"
  );
}

function asHex(value: unknown, what: string): Hex {
  if (typeof value !== "string" || !isHex(value)) throw new RpcError(-32602, `invalid ${what}`);
  return value;
}

function asAddress(value: unknown): Address {
  if (typeof value !== "string" || !/^0x[0-9a-fA-F]{40}$/.test(value))
    throw new RpcError(-32602, "invalid address");
  return value as Address;
}

function asCallRequest(value: unknown): RpcCallRequest {
  if (typeof value !== "object" || value === null) throw new RpcError(-32602, "invalid call request");
  return value as RpcCallRequest;
}

/** Resolves a block tag, number or EIP-1898 object to a block number. */
function blockNumberOf(chain: DevnetChain, tag: unknown): bigint {
  if (tag === undefined || tag === null) return chain.latest.number;
  if (typeof tag === "object") {
    const selector = tag as { blockNumber?: unknown; blockHash?: unknown };
    if (selector.blockHash !== undefined) {
      const block = chain.blockByHash(asHex(selector.blockHash, "block hash"));
      if (!block) throw new RpcError(-32000, "header not found");
      return block.number;
    }
    return blockNumberOf(chain, selector.blockNumber);
  }
  if (tag === "latest" || tag === "pending" || tag === "safe" || tag === "finalized")
    return chain.latest.number;
  if (tag === "earliest") return 0n;
  return hexToBigInt(asHex(tag, "block number"));
}

function formatBlock(chain: DevnetChain, block: DevnetBlock, full: boolean) {
  return {
    number: quantity(block.number),
    hash: block.hash,
    parentHash: block.parentHash,
    nonce: "0x0000000000000000",
    sha3Uncles: EMPTY_UNCLES_HASH,
    logsBloom: ZERO_BLOOM,
    transactionsRoot: zeroHash,
    stateRoot: zeroHash,
    receiptsRoot: zeroHash,
    miner: zeroAddress,
    difficulty: "0x0",
    totalDifficulty: "0x0",
    extraData: "0x",
    size: "0x0",
    gasLimit: quantity(BLOCK_GAS_LIMIT),
    gasUsed: quantity(block.gasUsed),
    timestamp: quantity(block.timestamp),
    transactions: full
      ? block.transactions.flatMap((hash) => {
          const tx = chain.transaction(hash);
          return tx ? [formatTransaction(tx)] : [];
        })
      : block.transactions,
    uncles: [],
    baseFeePerGas: quantity(BASE_FEE_PER_GAS),
    mixHash: zeroHash,
    withdrawals: [],
    withdrawalsRoot: zeroHash,
  };
}

function formatLog(log: DevnetLog) {
  return {
    address: log.address,
    topics: log.topics,
    data: log.data,
    blockNumber: quantity(log.blockNumber),
    blockHash: log.blockHash,
    transactionHash: log.transactionHash,
    transactionIndex: "0x0",
    logIndex: quantity(log.logIndex),
    removed: false,
  };
}

function formatReceipt(receipt: DevnetReceipt) {
  return {
    transactionHash: receipt.transactionHash,
    transactionIndex: "0x0",
    blockHash: receipt.blockHash,
    blockNumber: quantity(receipt.blockNumber),
    from: receipt.from,
    to: receipt.to,
    cumulativeGasUsed: quantity(receipt.gasUsed),
    gasUsed: quantity(receipt.gasUsed),
    effectiveGasPrice: quantity(receipt.effectiveGasPrice),
    contractAddress: null,
    logs: receipt.logs.map(formatLog),
    logsBloom: ZERO_BLOOM,
    status: receipt.status === "success" ? "0x1" : "0x0",
    type: "0x76",
    feeToken: receipt.feeToken,
    feePayer: receipt.feePayer,
  };
}

function formatTransaction(entry: DevnetTransaction) {
  const { tx } = entry;
  const receipt = entry.blockNumber === undefined ? undefined : { blockNumber: entry.blockNumber };
  let signature: unknown;
  try {
    signature = tx.signature ? Transaction.z_SignatureEnvelope.toRpc(tx.signature) : undefined;
  } catch {
    signature = undefined;
  }
  return {
    type: "0x76",
    hash: entry.hash,
    from: entry.from,
    chainId: quantity(tx.chainId),
    nonce: quantity(entry.nonce),
    nonceKey: quantity(entry.nonceKey),
    gas: quantity(tx.gas ?? 0n),
    maxFeePerGas: quantity(tx.maxFeePerGas ?? 0n),
    maxPriorityFeePerGas: quantity(tx.maxPriorityFeePerGas ?? 0n),
    gasPrice: quantity(BASE_FEE_PER_GAS),
    calls: tx.calls.map((call) => ({
      to: call.to ?? null,
      value: quantity(call.value ?? 0n),
      input: call.data ?? "0x",
    })),
    input: "0x",
    value: "0x0",
    accessList: [],
    ...(tx.validBefore === undefined ? {} : { validBefore: quantity(tx.validBefore) }),
    ...(tx.validAfter === undefined ? {} : { validAfter: quantity(tx.validAfter) }),
    feeToken: entry.feeToken,
    ...(tx.feePayerSignature
      ? {
          feePayerSignature: {
            r: tx.feePayerSignature.r,
            s: tx.feePayerSignature.s,
            yParity: quantity(tx.feePayerSignature.yParity ?? 0),
          },
        }
      : {}),
    ...(signature === undefined ? {} : { signature }),
    blockHash: entry.blockHash ?? null,
    blockNumber: receipt ? quantity(receipt.blockNumber) : null,
    transactionIndex: receipt ? "0x0" : null,
  };
}

/**
 * Tempo's eth_fillTransaction: fills nonce, gas and fees of a Tempo transaction request and
 * returns `{ raw, tx }` (viem reads `tx`, formats it with the tempo chain formatter, and keeps
 * its gas, fees, nonce, nonceKey and, when the request had none, feeToken). A reverting request
 * fails like eth_estimateGas does.
 */
async function fillTransaction(chain: DevnetChain, request: RpcCallRequest) {
  chain.simulate(request);
  const from = request.from ?? zeroAddress;
  const nonceKey = request.nonceKey === undefined ? 0n : hexToBigInt(request.nonceKey);
  const nonce =
    request.nonce !== undefined
      ? hexToBigInt(request.nonce)
      : nonceKey === EXPIRING_NONCE_KEY
        ? 0n
        : chain.nextNonce(from, nonceKey);
  const calls = (
    request.calls ?? [{ to: request.to ?? null, data: request.data ?? request.input, value: request.value }]
  ).map((call) => ({ to: call.to ?? null, data: call.data ?? call.input ?? "0x", value: call.value }));
  const gas = request.gas === undefined ? gasFor(calls.length) : hexToBigInt(request.gas);
  const maxPriorityFeePerGas =
    request.maxPriorityFeePerGas === undefined ? 0n : hexToBigInt(request.maxPriorityFeePerGas);
  const maxFeePerGas =
    request.maxFeePerGas === undefined
      ? BASE_FEE_PER_GAS + maxPriorityFeePerGas
      : hexToBigInt(request.maxFeePerGas);
  const feeToken = request.feeToken ?? USDC_E;
  const validBefore =
    request.validBefore === undefined ? undefined : Number(hexToBigInt(request.validBefore));
  const validAfter = request.validAfter === undefined ? undefined : Number(hexToBigInt(request.validAfter));
  let raw: Hex = "0x";
  try {
    raw = await Transaction.serialize({
      type: "tempo",
      chainId: chain.chainId,
      calls: calls.map((call) => ({
        ...(call.to ? { to: call.to } : {}),
        data: call.data,
        ...(call.value && call.value !== "0x" ? { value: hexToBigInt(call.value) } : {}),
      })),
      gas,
      maxFeePerGas,
      maxPriorityFeePerGas,
      nonce: Number(nonce),
      nonceKey,
      feeToken,
      ...(validBefore === undefined ? {} : { validBefore }),
      ...(validAfter === undefined ? {} : { validAfter }),
    } as never);
  } catch {
    // The unsigned encoding is informational only; viem signs from `tx`.
  }
  return {
    raw,
    tx: {
      type: "0x76",
      chainId: quantity(chain.chainId),
      from,
      calls: calls.map((call) => ({
        to: call.to,
        ...(call.value && call.value !== "0x" && hexToBigInt(call.value) !== 0n ? { value: call.value } : {}),
        input: call.data,
      })),
      gas: quantity(gas),
      maxFeePerGas: quantity(maxFeePerGas),
      maxPriorityFeePerGas: quantity(maxPriorityFeePerGas),
      nonce: quantity(nonce),
      nonceKey: quantity(nonceKey),
      feeToken,
      accessList: request.accessList ?? [],
      ...(validBefore === undefined ? {} : { validBefore: quantity(validBefore) }),
      ...(validAfter === undefined ? {} : { validAfter: quantity(validAfter) }),
      ...(request.keyAuthorization === undefined ? {} : { keyAuthorization: request.keyAuthorization }),
    },
  };
}

function feeHistory(chain: DevnetChain, [count, newest, percentiles]: unknown[]) {
  const blocks = Number(typeof count === "string" ? hexToBigInt(asHex(count, "block count")) : (count ?? 1));
  const newestBlock = blockNumberOf(chain, newest);
  const oldest = newestBlock - BigInt(Math.max(blocks, 1)) + 1n;
  const first = oldest < 0n ? 0n : oldest;
  const span = Number(newestBlock - first) + 1;
  const rewards = Array.isArray(percentiles) ? percentiles.map(() => "0x0") : undefined;
  return {
    oldestBlock: quantity(first),
    baseFeePerGas: Array.from({ length: span + 1 }, () => quantity(BASE_FEE_PER_GAS)),
    gasUsedRatio: Array.from({ length: span }, () => 0),
    ...(rewards ? { reward: Array.from({ length: span }, () => rewards) } : {}),
  };
}

interface LogFilter {
  fromBlock?: unknown;
  toBlock?: unknown;
  blockHash?: unknown;
  address?: Address | Address[];
  topics?: Array<Hex | Hex[] | null>;
}

function getLogs(chain: DevnetChain, filter: LogFilter) {
  let from: bigint;
  let to: bigint;
  if (filter.blockHash !== undefined) {
    const block = chain.blockByHash(asHex(filter.blockHash, "block hash"));
    if (!block) throw new RpcError(-32000, "unknown block");
    from = block.number;
    to = block.number;
  } else {
    from = blockNumberOf(chain, filter.fromBlock ?? "latest");
    to = blockNumberOf(chain, filter.toBlock ?? "latest");
  }
  const addresses =
    filter.address === undefined
      ? undefined
      : (Array.isArray(filter.address) ? filter.address : [filter.address]).map((a) => a.toLowerCase());
  const matches: ReturnType<typeof formatLog>[] = [];
  for (let number = from; number <= to && number <= chain.latest.number; number++) {
    const block = chain.block(number);
    if (!block) continue;
    for (const receipt of chain.receiptsOf(block)) {
      for (const log of receipt.logs) {
        if (addresses && !addresses.includes(log.address.toLowerCase())) continue;
        if (!topicsMatch(log.topics, filter.topics ?? [])) continue;
        matches.push(formatLog(log));
      }
    }
  }
  return matches;
}

function topicsMatch(topics: readonly Hex[], wanted: ReadonlyArray<Hex | Hex[] | null>): boolean {
  return wanted.every((want, index) => {
    if (want === null) return true;
    const topic = topics[index]?.toLowerCase();
    if (topic === undefined) return false;
    return (Array.isArray(want) ? want : [want]).some((candidate) => candidate.toLowerCase() === topic);
  });
}
