import { randomBytes, randomInt } from "node:crypto";
import { Session } from "mppx/tempo";
import {
  type Address,
  type Chain,
  type Client,
  createClient,
  encodeFunctionData,
  type Hex,
  http,
  type LocalAccount,
  type Transport,
  toHex,
} from "viem";
import { getChainId, prepareTransactionRequest, signTransaction } from "viem/actions";
import { tempo, tempoDevnet, tempoLocalnet, tempoModerato } from "viem/chains";
import { Transaction } from "viem/tempo";
import { type ChannelState, openingDeposit } from "./channel.js";
import type { SessionTerms } from "./terms.js";
import { type ChannelDescriptor, PaidSessionError } from "./types.js";

const { Channel, Voucher, escrowAbi } = Session.Precompile;
const KNOWN_CHAINS: readonly Chain[] = [tempo, tempoModerato, tempoDevnet, tempoLocalnet];

/**
 * The payer's key at work: signs vouchers and the open and top-up transactions (filled over
 * the RPC, never broadcast: the server broadcasts them).
 */
export class Signer {
  readonly #clients = new Map<number, Client<Transport, Chain>>();

  constructor(
    private readonly account: LocalAccount,
    private readonly rpcUrl: string,
  ) {}

  /**
   * Builds and signs the open transaction and the first voucher (cumulative = amount): the new
   * channel, and the open credential payload that carries it.
   */
  async open(
    terms: SessionTerms,
    maxDeposit: bigint | undefined,
  ): Promise<{ channel: ChannelState; payload: Record<string, unknown> }> {
    const client = await this.#client(terms.chainId);
    const deposit = openingDeposit(terms.amount, terms.suggestedDeposit, maxDeposit);
    const authorizedSigner = this.account.address;
    const salt = toHex(randomBytes(32));
    const data = encodeFunctionData({
      abi: escrowAbi,
      functionName: "open",
      args: [terms.payee, terms.operator, terms.token, deposit, salt, authorizedSigner],
    });
    const transaction = await this.#signCalls(client, terms, [{ to: terms.escrow, data }]);
    const expiringNonceHash = Channel.computeExpiringNonceHash(
      Channel.transactionForExpiringNonceHash({
        ...(terms.feePayer ? { feePayer: true as const } : {}),
        transaction: Transaction.deserialize(transaction) as never,
      }),
      { sender: this.account.address },
    );
    const descriptor: ChannelDescriptor = {
      payer: this.account.address,
      payee: terms.payee,
      operator: terms.operator,
      token: terms.token,
      salt,
      authorizedSigner,
      expiringNonceHash,
    };
    const channelId = Channel.computeId({ ...descriptor, chainId: terms.chainId, escrow: terms.escrow });
    const cumulativeAmount = terms.amount;
    const signature = await Voucher.signVoucher(
      client,
      this.account,
      { channelId, cumulativeAmount },
      terms.escrow,
      terms.chainId,
    );
    const channel: ChannelState = {
      channelId,
      descriptor,
      chainId: terms.chainId,
      escrow: terms.escrow,
      deposit,
      cumulativeAmount,
      signature,
      spent: 0n,
      acceptedCumulative: 0n,
    };
    const payload = {
      action: "open",
      type: "transaction",
      channelId,
      transaction,
      signature,
      descriptor,
      cumulativeAmount: cumulativeAmount.toString(),
      authorizedSigner,
    };
    return { channel, payload };
  }

  /** Signs a voucher for `cumulativeAmount` on the channel. */
  async voucher(channel: ChannelState, cumulativeAmount: bigint): Promise<Hex> {
    const client = await this.#client(channel.chainId);
    return Voucher.signVoucher(
      client,
      this.account,
      { channelId: channel.channelId, cumulativeAmount },
      channel.escrow,
      channel.chainId,
    );
  }

  /** Signs the transaction that adds `additional` to the channel's deposit. */
  async topUp(channel: ChannelState, terms: SessionTerms, additional: bigint): Promise<Hex> {
    const client = await this.#client(channel.chainId);
    const data = encodeFunctionData({
      abi: escrowAbi,
      functionName: "topUp",
      args: [channel.descriptor, additional],
    });
    const now = Math.floor(Date.now() / 1000);
    return this.#signCalls(client, terms, [{ to: channel.escrow, data }], {
      // A random past validAfter keeps otherwise identical top-ups distinct (as mppx does).
      validAfter: randomInt(0, Math.max(1, now - 60)),
    });
  }

  async #signCalls(
    client: Client<Transport, Chain>,
    terms: SessionTerms,
    calls: Array<{ to: Address; data: Hex }>,
    extra: { validAfter?: number } = {},
  ): Promise<Hex> {
    // Session transactions use TIP-1009 expiring nonces and pay fees in the channel token,
    // exactly as mppx's client builds them; the server broadcasts them.
    const prepared = await prepareTransactionRequest(client, {
      account: this.account,
      calls,
      nonceKey: "expiring",
      ...(terms.feePayer ? { feePayer: true } : {}),
      feeToken: terms.feeToken ?? terms.token,
      ...extra,
    } as never);
    return (await signTransaction(client, {
      ...(prepared as object),
      account: this.account,
    } as never)) as Hex;
  }

  async #client(chainId: number): Promise<Client<Transport, Chain>> {
    const existing = this.#clients.get(chainId);
    if (existing) return existing;
    const chain = KNOWN_CHAINS.find((candidate) => candidate.id === chainId);
    if (!chain)
      throw new PaidSessionError("challenge_invalid", `the challenge names unknown chain ${chainId}`);
    const client = createClient({
      account: this.account,
      chain,
      transport: http(this.rpcUrl),
      pollingInterval: 250,
    });
    const rpcChainId = await getChainId(client);
    if (rpcChainId !== chainId) {
      throw new PaidSessionError(
        "challenge_invalid",
        `the challenge is for chain ${chainId} but the RPC serves chain ${rpcChainId}`,
      );
    }
    this.#clients.set(chainId, client);
    return client;
  }
}
