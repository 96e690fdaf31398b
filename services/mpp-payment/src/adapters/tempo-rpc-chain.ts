import { Session } from "mppx/tempo";
import {
  type Account,
  type Address,
  type Client,
  createClient,
  type EIP1193RequestFn,
  type Hex,
  http,
  keccak256,
  type TransactionReceipt,
  type Transport,
  zeroAddress,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { getTransaction, sendRawTransaction, waitForTransactionReceipt } from "viem/actions";
import { tempo } from "viem/chains";
import type { Chain, ChannelDescriptor, OnChainState, SignedVoucher } from "../domain/ports.js";

const Precompile = Session.Precompile.Chain;

/** Options of the Tempo JSON-RPC chain adapter. */
export interface TempoRpcChainOptions {
  /** JSON-RPC endpoint (TEMPO_RPC_URL): Tempo mainnet, or the devnet in tests and the dev stack. */
  url: string;
  chainId: number;
  escrow: Address;
  /** The session currency; server transactions pay their fees in it. */
  currency: Address;
  /** The payee every channel names. */
  recipient: Address;
  /** Private key of the payee, which sends settle and close; without it those are unavailable. */
  payeeKey?: Hex;
  /** How often receipts are polled. Default 500 ms (Tempo blocks come about every second). */
  pollingIntervalMs?: number;
  /**
   * How long to wait for a receipt. Default 30 s: an expiring-nonce transaction is valid for
   * at most 30 s after its block time (TIP-1009), so it is mined or dropped by then.
   */
  receiptTimeoutMs?: number;
  /**
   * How long one JSON-RPC request may take before it is abandoned (and retried, at most 3
   * times). Default 10 s. A chain that does not answer fails the call in bounded time instead
   * of holding the caller.
   */
  rpcTimeoutMs?: number;
}

/** Thrown when a transaction was mined but did not do what it had to; never carries payment material. */
export class ChainCheckError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ChainCheckError";
  }
}

/**
 * The one place that speaks JSON-RPC to Tempo: viem clients on the `tempo` chain definition (0x76
 * transactions, expiring nonces, fee tokens), retried on transient transport errors (viem's http
 * transport: 3 retries with backoff on 429/5xx and JSON-RPC limit errors), reads after a write
 * pinned to the receipt block and retried while a lagging node catches up (a load-balanced RPC may
 * read from a node behind the one that took the write; mppx#617). The transaction checks are mppx's
 * own (Session.Precompile.Chain).
 */
export function createTempoRpcChain(opts: TempoRpcChainOptions): Chain {
  const account: Account | undefined = opts.payeeKey ? privateKeyToAccount(opts.payeeKey) : undefined;
  if (account && account.address.toLowerCase() !== opts.recipient.toLowerCase()) {
    throw new Error(
      "the payee key does not belong to the recipient: the escrow only accepts the payee's settle and close",
    );
  }
  const chain = { ...tempo, id: opts.chainId };
  const transport = http(opts.url, { retryCount: 3, retryDelay: 200, timeout: opts.rpcTimeoutMs ?? 10_000 });
  const pollingInterval = opts.pollingIntervalMs ?? 500;
  const client: Client = createClient({
    chain,
    transport,
    pollingInterval,
    ...(account ? { account } : {}),
  });
  const receiptTimeoutMs = opts.receiptTimeoutMs ?? 30_000;
  const { chainId, escrow, currency, recipient } = opts;

  const validateOpen = (transaction: Hex, descriptor: ChannelDescriptor, channelId: Hex) =>
    Precompile.validateOpenCredentialTransaction({
      chainId,
      escrowContract: escrow,
      expectedPayee: recipient,
      expectedCurrency: currency,
      expectedOperator: zeroAddress,
      expectedAuthorizedSigner: descriptor.authorizedSigner,
      expectedChannelId: channelId,
      expectedExpiringNonceHash: descriptor.expiringNonceHash,
      expectedPayer: descriptor.payer,
      serializedTransaction: transaction,
    });

  const validateTopUp = (
    transaction: Hex,
    descriptor: ChannelDescriptor,
    channelId: Hex,
    additionalDeposit: bigint,
  ) =>
    Precompile.validateTopUpCredentialTransaction({
      chainId,
      escrowContract: escrow,
      expectedChannelId: channelId,
      expectedCurrency: currency,
      descriptor,
      additionalDeposit,
      serializedTransaction: transaction,
    });

  /** Waits for a mined, successful receipt; bounded in time. */
  async function minedReceipt(hash: Hex): Promise<TransactionReceipt> {
    const receipt = await waitForTransactionReceipt(client, {
      hash,
      timeout: receiptTimeoutMs,
      checkReplacement: false,
    });
    if (receipt.status !== "success") throw new ChainCheckError("transaction reverted");
    return receipt;
  }

  /**
   * Broadcasts a signed transaction and waits for it. Its hash is known before it is sent, so
   * when the send fails (a lost answer, a timeout, a retried send the node calls a duplicate)
   * the node is asked whether it has the transaction anyway: if so it is waited for like any
   * other, so a transaction that went on chain is never reported as failed (and its deposit
   * never stranded: docs/paid-door.md, "Resilience of the paid door").
   */
  async function broadcast(serializedTransaction: Hex): Promise<TransactionReceipt> {
    const hash = keccak256(serializedTransaction);
    try {
      await sendRawTransaction(client, { serializedTransaction });
    } catch (err) {
      const known = await getTransaction(client, { hash }).then(
        () => true,
        () => false,
      );
      if (!known) throw err;
    }
    return minedReceipt(hash);
  }

  /**
   * Runs an mppx helper that signs and sends the payee's own transaction (settle, close) on a
   * client that signs but does not send: the signed transaction comes back here and goes out
   * through broadcast().
   */
  async function sendOwn(send: (signer: Client) => Promise<Hex>): Promise<TransactionReceipt> {
    let signed: Hex | undefined;
    const signOnly: Transport = (params) => {
      const inner = transport(params);
      const request = (async (args, options) => {
        if (args.method === "eth_sendRawTransaction") {
          signed = (args.params as [Hex])[0];
          return keccak256(signed);
        }
        return inner.request(args, options);
      }) as EIP1193RequestFn;
      return { ...inner, request };
    };
    const signer = createClient({ chain, transport: signOnly, pollingInterval, account: requireAccount() });
    await send(signer);
    if (!signed) throw new ChainCheckError("no transaction was signed");
    return broadcast(signed);
  }

  /** The payee's own transaction (settle, close): expiring nonce and the session currency as fee token. */
  function requireAccount(): Account {
    if (!account) throw new ChainCheckError("no payee key configured");
    return account;
  }

  return {
    canSend: account !== undefined,

    checkOpen(transaction, descriptor, channelId) {
      const validated = validateOpen(transaction, descriptor, channelId);
      if (validated.transaction.chainId !== chainId)
        throw new ChainCheckError("open transaction is for another chain");
      return { deposit: validated.openDeposit };
    },

    async submitOpen(transaction, descriptor, channelId) {
      const validated = validateOpen(transaction, descriptor, channelId);
      const receipt = await broadcast(transaction);
      const opened = Precompile.readChannelOpenedReceiptFields(
        Precompile.getChannelEvent(receipt, "ChannelOpened", channelId),
      );
      Precompile.validateChannelOpenedReceipt({
        chainId,
        descriptor: validated.descriptor,
        emittedChannelId: opened.channelId,
        emittedDeposit: opened.deposit,
        emittedExpiringNonceHash: opened.expiringNonceHash,
        escrow,
        expectedChannelId: channelId,
        openDeposit: validated.openDeposit,
      });
      const read = await Precompile.readbackWithRetry(() =>
        Precompile.getChannel(client, validated.descriptor, escrow, receipt.blockNumber),
      );
      Precompile.validateOpenReadbackState({ emittedDeposit: opened.deposit, state: read.state });
      return { txHash: receipt.transactionHash, deposit: opened.deposit };
    },

    checkTopUp(transaction, descriptor, channelId, additionalDeposit) {
      const validated = validateTopUp(transaction, descriptor, channelId, additionalDeposit);
      if (validated.transaction.chainId !== chainId)
        throw new ChainCheckError("top-up transaction is for another chain");
    },

    async submitTopUp(transaction, descriptor, channelId, additionalDeposit) {
      validateTopUp(transaction, descriptor, channelId, additionalDeposit);
      const receipt = await broadcast(transaction);
      const toppedUp = Precompile.readTopUpReceiptFields(
        Precompile.getChannelEvent(receipt, "TopUp", channelId),
      );
      Precompile.validateTopUpReceipt({ emittedChannelId: toppedUp.channelId, expectedChannelId: channelId });
      const state = await Precompile.readbackWithRetry(() =>
        Precompile.getChannelState(client, channelId, escrow, receipt.blockNumber),
      );
      Precompile.validateTopUpReadbackState({ newDeposit: toppedUp.newDeposit, state });
      return { txHash: receipt.transactionHash, deposit: toppedUp.newDeposit };
    },

    async state(channelId): Promise<OnChainState> {
      return Precompile.getChannelState(client, channelId, escrow);
    },

    async settle(descriptor, channelId, voucher: SignedVoucher) {
      const receipt = await sendOwn((signer) =>
        Precompile.settleOnChain(signer, descriptor, voucher.cumulative, voucher.signature, escrow, {
          account: requireAccount(),
          feeToken: currency,
        }),
      );
      const { newSettled } = Precompile.readSettledReceiptFields(
        Precompile.getChannelEvent(receipt, "Settled", channelId),
      );
      return { txHash: receipt.transactionHash, settled: newSettled };
    },

    async close(descriptor, channelId, voucher, capture) {
      const receipt = await sendOwn((signer) =>
        Precompile.closeOnChain(signer, descriptor, voucher.cumulative, capture, voucher.signature, escrow, {
          account: requireAccount(),
          feeToken: currency,
        }),
      );
      const closed = Precompile.readChannelClosedReceiptFields(
        Precompile.getChannelEvent(receipt, "ChannelClosed", channelId),
      );
      return { txHash: receipt.transactionHash, ...closed };
    },
  };
}
