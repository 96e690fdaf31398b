import { Session } from "mppx/tempo";
import {
  type Address,
  encodeAbiParameters,
  type Hex,
  hexToBigInt,
  keccak256,
  parseAbiParameters,
  toHex,
  zeroAddress,
  zeroHash,
} from "viem";
import { Secp256k1, TokenId, Transaction } from "viem/tempo";
import {
  BASE_FEE_PER_GAS,
  EXPIRING_NONCE_KEY,
  FEE_MANAGER,
  knownToken,
  MAX_VALID_BEFORE_WINDOW,
  TEMPO_CHAIN_ID,
  USDC_E,
} from "./constants.js";
import { type Call, type ExecutionContext, executeCall, type LogEntry, Revert } from "./execute.js";
import { WorldState } from "./state.js";

/** A JSON-RPC error the devnet answers with (code, message and optional revert data). */
export class RpcError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly data?: Hex,
  ) {
    super(message);
    this.name = "RpcError";
  }
}

/** A deserialized, signed Tempo transaction as viem/tempo decodes it. */
export type TempoTransaction = ReturnType<typeof Transaction.deserialize<`0x76${string}`>>;

/** A transaction the devnet accepted; `blockNumber` is set once it is mined. */
export interface DevnetTransaction {
  readonly hash: Hex;
  readonly raw: Hex;
  readonly tx: TempoTransaction;
  readonly from: Address;
  /** Who pays the fee: the sponsor when the transaction carries a fee-payer signature, else the sender. */
  readonly feePayer: Address;
  readonly feeToken: Address;
  readonly nonceKey: bigint;
  readonly nonce: bigint;
  /** keccak256(encodeForSigning(tx) || sender): the TIP-1009 replay key and the TIP-1034 open context. */
  readonly contextHash: Hex;
  blockNumber?: bigint;
  blockHash?: Hex;
}

/** A log placed in a block. */
export interface DevnetLog extends LogEntry {
  readonly blockNumber: bigint;
  readonly blockHash: Hex;
  readonly transactionHash: Hex;
  readonly logIndex: number;
}

/** The receipt of a mined transaction. */
export interface DevnetReceipt {
  readonly transactionHash: Hex;
  readonly blockNumber: bigint;
  readonly blockHash: Hex;
  readonly from: Address;
  readonly to: Address | null;
  readonly status: "success" | "reverted";
  readonly gasUsed: bigint;
  readonly effectiveGasPrice: bigint;
  readonly feeToken: Address;
  readonly feePayer: Address;
  /** The fee charged in `feeToken` base units (the devnet's fixed `feePerTransaction`). */
  readonly fee: bigint;
  readonly logs: readonly DevnetLog[];
  /** Readable revert reason when `status` is "reverted". */
  readonly revertReason?: string;
}

/** A sealed block. */
export interface DevnetBlock {
  readonly number: bigint;
  readonly hash: Hex;
  readonly parentHash: Hex;
  readonly timestamp: bigint;
  readonly transactions: readonly Hex[];
  readonly gasUsed: bigint;
}

/** An eth_call / eth_estimateGas / eth_fillTransaction request in its JSON-RPC form. */
export interface RpcCallRequest {
  from?: Address;
  to?: Address | null;
  data?: Hex;
  input?: Hex;
  value?: Hex;
  calls?: Array<{ to?: Address | null; data?: Hex; input?: Hex; value?: Hex }>;
  gas?: Hex;
  maxFeePerGas?: Hex;
  maxPriorityFeePerGas?: Hex;
  nonce?: Hex;
  nonceKey?: Hex;
  validBefore?: Hex;
  validAfter?: Hex;
  feeToken?: Address;
  accessList?: unknown[];
  keyAuthorization?: unknown;
}

/** How the devnet charges fees and what it holds at genesis. */
export interface DevnetChainOptions {
  /** Fixed fee per transaction in fee-token base units, charged to the fee payer only. Default 0. */
  feePerTransaction?: bigint;
  /** Genesis balances. */
  genesis?: ReadonlyArray<{ address: Address; amount: bigint; token?: Address }>;
  /** How many recent block states stay readable by number (older reads fail like a pruned node). */
  retainedStates?: number;
}

const blockHashParameters = parseAbiParameters("uint256, bytes32, uint64, bytes32[]");
const GAS_PER_TRANSACTION = 21_000n;
const GAS_PER_CALL = 120_000n;

/** Gas the devnet reports for a transaction with `calls` calls (estimates and receipts agree). */
export function gasFor(calls: number): bigint {
  return GAS_PER_TRANSACTION + GAS_PER_CALL * BigInt(Math.max(calls, 1));
}

/**
 * The devnet's chain: an instant-sealing ledger of one block per accepted transaction, on top of
 * the in-memory system contracts in execute.ts. All state changes happen synchronously inside
 * one call, so concurrent RPC requests can never interleave within a transaction.
 */
export class DevnetChain {
  readonly chainId = TEMPO_CHAIN_ID;
  readonly feePerTransaction: bigint;
  private state: WorldState;
  private readonly snapshots = new Map<bigint, WorldState>();
  private readonly blocks: DevnetBlock[] = [];
  private readonly blocksByHash = new Map<string, DevnetBlock>();
  private readonly transactions = new Map<string, DevnetTransaction>();
  private readonly receipts = new Map<string, DevnetReceipt>();
  /** TIP-1009 replay keys (contextHash) of accepted expiring-nonce transactions → their validBefore. */
  private readonly usedExpiringNonces = new Map<string, bigint>();
  private readonly pending: DevnetTransaction[] = [];
  private readonly waiters = new Map<string, Array<(outcome: DevnetReceipt | RpcError) => void>>();
  private readonly retainedStates: number;
  private timeOffset = 0;
  private pausedUntil = 0;
  private pauseTimer: NodeJS.Timeout | undefined;

  constructor(options: DevnetChainOptions = {}) {
    this.feePerTransaction = options.feePerTransaction ?? 0n;
    this.retainedStates = options.retainedStates ?? 256;
    const genesis = WorldState.empty();
    for (const entry of options.genesis ?? []) {
      const token = entry.token ?? USDC_E;
      genesis.setBalance(token, entry.address, genesis.balanceOf(token, entry.address) + entry.amount);
    }
    this.state = genesis;
    this.sealBlock(this.wallClock(), [], genesis);
  }

  /** The newest sealed block. */
  get latest(): DevnetBlock {
    return this.blocks[this.blocks.length - 1]!;
  }

  /** The committed state after the newest block. */
  get current(): WorldState {
    return this.state;
  }

  block(number: bigint): DevnetBlock | undefined {
    return number < 0n ? undefined : this.blocks[Number(number)];
  }

  blockByHash(hash: Hex): DevnetBlock | undefined {
    return this.blocksByHash.get(hash.toLowerCase());
  }

  transaction(hash: Hex): DevnetTransaction | undefined {
    return this.transactions.get(hash.toLowerCase());
  }

  receipt(hash: Hex): DevnetReceipt | undefined {
    return this.receipts.get(hash.toLowerCase());
  }

  /** Every receipt of a block, in order. */
  receiptsOf(block: DevnetBlock): DevnetReceipt[] {
    return block.transactions.flatMap((hash) => this.receipt(hash) ?? []);
  }

  /** The state after block `number`; fails like a node without that block (or with it pruned). */
  stateAt(number: bigint): WorldState {
    if (number > this.latest.number) throw new RpcError(-32000, `header not found: block ${number}`);
    const state = this.snapshots.get(number);
    if (state === undefined)
      throw new RpcError(-32000, `missing trie node: state of block ${number} was pruned`);
    return state;
  }

  /** Seconds on the devnet clock: wall clock plus the test offset. */
  now(): bigint {
    return this.wallClock();
  }

  /** The timestamp the next block gets: the devnet clock, never earlier than the newest block. */
  nextTimestamp(): bigint {
    const now = this.wallClock();
    return now > this.latest.timestamp ? now : this.latest.timestamp;
  }

  /** Moves the devnet clock by `seconds` from the wall clock (absolute, not cumulative). */
  setTimeOffset(seconds: number): void {
    this.timeOffset = Math.trunc(seconds);
  }

  /** Holds accepted transactions for `ms`, then mines them in order (expired ones are dropped). */
  pauseMining(ms: number): void {
    this.pausedUntil = Math.max(this.pausedUntil, Date.now() + Math.max(0, ms));
    if (this.pauseTimer !== undefined) clearTimeout(this.pauseTimer);
    this.pauseTimer = setTimeout(() => this.resumeMining(), Math.max(0, this.pausedUntil - Date.now()));
    this.pauseTimer.unref();
  }

  /** Mints `amount` of `token` to `address` in a block of its own. */
  fund(address: Address, amount: bigint, token: Address = USDC_E): void {
    if (!knownToken(token)) throw new Error(`unknown token ${token}`);
    const next = this.state.clone();
    next.setBalance(token, address, next.balanceOf(token, address) + amount);
    this.sealBlock(this.nextTimestamp(), [], next);
  }

  /** Stops timers; pending transactions stay unmined and their waiters fail. */
  close(): void {
    if (this.pauseTimer !== undefined) clearTimeout(this.pauseTimer);
    for (const tx of this.pending.splice(0)) this.notify(tx.hash, new RpcError(-32000, "devnet stopped"));
  }

  /**
   * Validates a signed raw transaction like a Tempo node's pool does, then mines it at once (or
   * queues it while mining is paused). Returns the transaction hash; rejections throw RpcError.
   */
  submit(raw: Hex): Hex {
    if (!raw.toLowerCase().startsWith("0x76")) {
      throw new RpcError(
        -32602,
        "invalid transaction: the devnet accepts only Tempo transactions (type 0x76)",
      );
    }
    let tx: TempoTransaction;
    try {
      tx = Transaction.deserialize(raw as `0x76${string}`);
    } catch (error) {
      throw new RpcError(-32602, `invalid transaction: ${(error as Error).message.split("\n")[0]}`);
    }
    const hash = keccak256(raw);
    if (this.transactions.has(hash)) throw new RpcError(-32000, "already known");
    if (tx.chainId !== this.chainId) throw new RpcError(-32000, `invalid chain id ${tx.chainId}`);
    const from = tx.from;
    if (from === undefined || tx.signature === undefined)
      throw new RpcError(-32000, "invalid sender signature");
    if (tx.feePayerSignature === null) {
      throw new RpcError(-32000, "transaction still waits for its fee payer signature");
    }
    const feePayer = tx.feePayerSignature ? recoverFeePayer(tx, from) : from;
    const feeToken = resolveFeeToken(tx.feeToken);
    if (tx.maxFeePerGas !== undefined && tx.maxFeePerGas < BASE_FEE_PER_GAS) {
      throw new RpcError(-32000, "max fee per gas less than block base fee");
    }
    const nonceKey = tx.nonceKey ?? 0n;
    const nonce = BigInt(tx.nonce ?? 0);
    const timestamp = this.nextTimestamp();
    checkTimeBounds(tx, nonceKey, timestamp);
    const contextHash = Session.Precompile.Channel.computeExpiringNonceHash(
      Session.Precompile.Channel.transactionForExpiringNonceHash({ transaction: tx }),
      { sender: from },
    );
    if (nonceKey === EXPIRING_NONCE_KEY) {
      if (nonce !== 0n) throw new RpcError(-32000, "expiring nonce transactions must use nonce 0");
      this.pruneExpiringNonces(timestamp);
      if (this.usedExpiringNonces.has(contextHash)) {
        throw new RpcError(-32000, "expiring nonce transaction already seen (replay)");
      }
    } else {
      const expected = this.nextNonce(from, nonceKey);
      if (nonce < expected)
        throw new RpcError(-32000, `nonce too low: next nonce ${expected}, tx nonce ${nonce}`);
      if (nonce > expected)
        throw new RpcError(-32000, `nonce too high: next nonce ${expected}, tx nonce ${nonce}`);
    }
    if (this.state.balanceOf(feeToken, feePayer) < this.feePerTransaction) {
      throw new RpcError(-32000, "insufficient funds for gas: fee payer's fee-token balance is too low");
    }
    const entry: DevnetTransaction = {
      hash,
      raw,
      tx,
      from,
      feePayer,
      feeToken,
      nonceKey,
      nonce,
      contextHash,
    };
    this.transactions.set(hash, entry);
    if (nonceKey === EXPIRING_NONCE_KEY)
      this.usedExpiringNonces.set(contextHash, BigInt(tx.validBefore ?? 0));
    if (Date.now() < this.pausedUntil) this.pending.push(entry);
    else this.mine(entry);
    return hash;
  }

  /** Resolves with the receipt once `hash` is mined; rejects if it is dropped or `timeoutMs` passes. */
  waitForReceipt(hash: Hex, timeoutMs: number): Promise<DevnetReceipt> {
    const mined = this.receipt(hash);
    if (mined) return Promise.resolve(mined);
    if (!this.transaction(hash)) return Promise.reject(new RpcError(-32000, "transaction not found"));
    return new Promise((resolve, reject) => {
      const key = hash.toLowerCase();
      const timer = setTimeout(() => {
        const list = this.waiters.get(key) ?? [];
        this.waiters.set(
          key,
          list.filter((waiter) => waiter !== settle),
        );
        reject(new RpcError(4, `transaction ${hash} was not mined within ${timeoutMs} ms`));
      }, timeoutMs);
      const settle = (outcome: DevnetReceipt | RpcError) => {
        clearTimeout(timer);
        if (outcome instanceof RpcError) reject(outcome);
        else resolve(outcome);
      };
      this.waiters.set(key, [...(this.waiters.get(key) ?? []), settle]);
    });
  }

  /**
   * Executes a call request without committing anything (eth_call, eth_estimateGas and
   * eth_fillTransaction dry runs). Returns the last call's return data; a revert throws the
   * JSON-RPC "execution reverted" error (code 3) with the revert data.
   */
  simulate(request: RpcCallRequest, blockNumber?: bigint): Hex {
    const pinned = blockNumber !== undefined && blockNumber !== this.latest.number;
    const state = (pinned ? this.stateAt(blockNumber) : this.state).clone();
    const timestamp = pinned ? this.block(blockNumber)!.timestamp : this.nextTimestamp();
    const sender = request.from ?? zeroAddress;
    // A dry run has no signed transaction, so open() gets a context hash derived from the request.
    const openContextHash = keccak256(toHex(JSON.stringify({ sender, request })));
    const ctx: ExecutionContext = {
      state,
      sender,
      timestamp,
      chainId: this.chainId,
      openContextHash,
      logs: [],
    };
    let output: Hex = "0x";
    try {
      for (const call of callsOf(request)) output = executeCall(ctx, call);
    } catch (error) {
      if (error instanceof Revert) {
        throw new RpcError(3, `execution reverted: ${error.message}`, error.data);
      }
      throw error;
    }
    return output;
  }

  /** The next nonce of `account` in lane `nonceKey`, counting transactions waiting to be mined. */
  nextNonce(account: Address, nonceKey: bigint): bigint {
    if (nonceKey === EXPIRING_NONCE_KEY) return 0n;
    const queued = this.pending.filter(
      (tx) => tx.nonceKey === nonceKey && tx.from.toLowerCase() === account.toLowerCase(),
    ).length;
    return this.state.nonce(account, nonceKey) + BigInt(queued);
  }

  private wallClock(): bigint {
    return BigInt(Math.floor(Date.now() / 1000) + this.timeOffset);
  }

  private resumeMining(): void {
    this.pausedUntil = 0;
    this.pauseTimer = undefined;
    for (const tx of this.pending.splice(0)) this.mine(tx);
  }

  private pruneExpiringNonces(timestamp: bigint): void {
    for (const [key, validBefore] of this.usedExpiringNonces) {
      if (validBefore <= timestamp) this.usedExpiringNonces.delete(key);
    }
  }

  /** Seals one block holding `entry`: fee and nonce always commit; the calls only if none reverts. */
  private mine(entry: DevnetTransaction): void {
    const timestamp = this.nextTimestamp();
    const { tx } = entry;
    if (entry.nonceKey === EXPIRING_NONCE_KEY && BigInt(tx.validBefore ?? 0) <= timestamp) {
      this.drop(entry, "expiring nonce transaction expired before it was mined");
      return;
    }
    const afterFee = this.state.clone();
    const feeBalance = afterFee.balanceOf(entry.feeToken, entry.feePayer);
    if (feeBalance < this.feePerTransaction) {
      this.drop(entry, "insufficient funds for gas");
      return;
    }
    if (this.feePerTransaction > 0n) {
      afterFee.setBalance(entry.feeToken, entry.feePayer, feeBalance - this.feePerTransaction);
      afterFee.setBalance(
        entry.feeToken,
        FEE_MANAGER,
        afterFee.balanceOf(entry.feeToken, FEE_MANAGER) + this.feePerTransaction,
      );
    }
    if (entry.nonceKey !== EXPIRING_NONCE_KEY)
      afterFee.setNonce(entry.from, entry.nonceKey, entry.nonce + 1n);

    const afterCalls = afterFee.clone();
    const logs: LogEntry[] = [];
    const ctx: ExecutionContext = {
      state: afterCalls,
      sender: entry.from,
      timestamp,
      chainId: this.chainId,
      openContextHash: entry.contextHash,
      logs,
    };
    let revertReason: string | undefined;
    try {
      for (const call of tx.calls) executeCall(ctx, call);
    } catch (error) {
      if (!(error instanceof Revert)) throw error;
      revertReason = error.message;
    }
    const block = this.sealBlock(timestamp, [entry.hash], revertReason === undefined ? afterCalls : afterFee);
    entry.blockNumber = block.number;
    entry.blockHash = block.hash;
    const gasUsed = minBigInt(tx.gas ?? gasFor(tx.calls.length), gasFor(tx.calls.length));
    const receipt: DevnetReceipt = {
      transactionHash: entry.hash,
      blockNumber: block.number,
      blockHash: block.hash,
      from: entry.from,
      to: tx.calls[0]?.to ?? null,
      status: revertReason === undefined ? "success" : "reverted",
      gasUsed,
      effectiveGasPrice: effectiveGasPrice(tx),
      feeToken: entry.feeToken,
      feePayer: entry.feePayer,
      fee: this.feePerTransaction,
      logs: (revertReason === undefined ? logs : []).map((log, logIndex) => ({
        ...log,
        blockNumber: block.number,
        blockHash: block.hash,
        transactionHash: entry.hash,
        logIndex,
      })),
      ...(revertReason === undefined ? {} : { revertReason }),
    };
    this.receipts.set(entry.hash, receipt);
    this.notify(entry.hash, receipt);
  }

  private drop(entry: DevnetTransaction, reason: string): void {
    this.transactions.delete(entry.hash);
    this.notify(entry.hash, new RpcError(-32000, reason));
  }

  private notify(hash: Hex, outcome: DevnetReceipt | RpcError): void {
    const key = hash.toLowerCase();
    const list = this.waiters.get(key) ?? [];
    this.waiters.delete(key);
    for (const waiter of list) waiter(outcome);
  }

  private sealBlock(timestamp: bigint, transactions: Hex[], state: WorldState): DevnetBlock {
    const parent = this.blocks[this.blocks.length - 1];
    const number = parent === undefined ? 0n : parent.number + 1n;
    const parentHash = parent?.hash ?? zeroHash;
    const hash = keccak256(
      encodeAbiParameters(blockHashParameters, [number, parentHash, timestamp, transactions]),
    );
    const gasUsed = transactions.reduce((sum, txHash) => {
      const tx = this.transaction(txHash)?.tx;
      return sum + (tx ? gasFor(tx.calls.length) : 0n);
    }, 0n);
    const block: DevnetBlock = { number, hash, parentHash, timestamp, transactions, gasUsed };
    this.blocks.push(block);
    this.blocksByHash.set(hash.toLowerCase(), block);
    this.state = state;
    this.snapshots.set(number, state);
    this.snapshots.delete(number - BigInt(this.retainedStates));
    return block;
  }
}

function minBigInt(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}

function effectiveGasPrice(tx: TempoTransaction): bigint {
  const offered = BASE_FEE_PER_GAS + (tx.maxPriorityFeePerGas ?? 0n);
  return tx.maxFeePerGas === undefined ? BASE_FEE_PER_GAS : minBigInt(tx.maxFeePerGas, offered);
}

function resolveFeeToken(feeToken: Address | bigint | undefined): Address {
  if (feeToken === undefined) return USDC_E;
  const address = typeof feeToken === "bigint" ? TokenId.toAddress(feeToken) : feeToken;
  const token = knownToken(address);
  if (!token) throw new RpcError(-32000, `fee token ${address} is not a TIP-20 token known to the devnet`);
  return token.address;
}

/** Recovers the sponsor of a fee-sponsored transaction from its fee-payer signature. */
function recoverFeePayer(tx: TempoTransaction, sender: Address): Address {
  const signature = tx.feePayerSignature;
  if (!signature) return sender;
  try {
    const payload = Transaction.z_TxEnvelopeTempo.getFeePayerSignPayload(
      Transaction.z_TxEnvelopeTempo.from(tx as never),
      { sender },
    );
    return Secp256k1.recoverAddress({
      payload,
      signature: {
        r: hexToBigInt(signature.r),
        s: hexToBigInt(signature.s),
        yParity: signature.yParity ?? 0,
      },
    });
  } catch {
    throw new RpcError(-32000, "invalid fee payer signature");
  }
}

/** TIP-1009 time bounds, checked against the timestamp the transaction's block would get. */
function checkTimeBounds(tx: TempoTransaction, nonceKey: bigint, timestamp: bigint): void {
  const validBefore = tx.validBefore === undefined ? undefined : BigInt(tx.validBefore);
  if (nonceKey === EXPIRING_NONCE_KEY) {
    if (validBefore === undefined)
      throw new RpcError(-32000, "expiring nonce transaction requires validBefore");
    if (validBefore > timestamp + MAX_VALID_BEFORE_WINDOW) {
      throw new RpcError(
        -32000,
        `expiring nonce valid_before ${validBefore} too far in the future (block timestamp ${timestamp}, max ${MAX_VALID_BEFORE_WINDOW}s)`,
      );
    }
  }
  if (validBefore !== undefined && validBefore <= timestamp) {
    throw new RpcError(
      -32000,
      `transaction expired: valid_before ${validBefore} <= block timestamp ${timestamp}`,
    );
  }
  if (tx.validAfter !== undefined && BigInt(tx.validAfter) > timestamp) {
    throw new RpcError(
      -32000,
      `transaction not valid yet: valid_after ${tx.validAfter} > block timestamp ${timestamp}`,
    );
  }
}

/** The calls of a JSON-RPC call request: Tempo `calls`, or the classic to/data/value. */
function callsOf(request: RpcCallRequest): Call[] {
  const toCall = (raw: { to?: Address | null; data?: Hex; input?: Hex; value?: Hex }): Call => ({
    to: raw.to ?? undefined,
    data: raw.data ?? raw.input ?? "0x",
    value: raw.value === undefined || raw.value === "0x" ? 0n : hexToBigInt(raw.value),
  });
  if (Array.isArray(request.calls) && request.calls.length > 0) return request.calls.map(toCall);
  return [toCall(request)];
}
