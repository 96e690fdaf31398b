import { randomBytes } from "node:crypto";
import { type GatewayConfig, parseGatewayConfig } from "@tollgate/config";
import { Challenge, Credential } from "mppx";
import { Session } from "mppx/tempo";
import { type Address, type Hex, keccak256, toHex, zeroAddress } from "viem";
import { generatePrivateKey, type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts";
import type { PaidRequest } from "../src/domain/catalog.js";
import type { Payments } from "../src/domain/payments.js";
import type { Chain, ChannelDescriptor, OnChainState, SignedVoucher } from "../src/domain/ports.js";
import type { PaymentSettings } from "../src/domain/settings.js";

export const CHAIN_ID = 4217;
export const USDC_E: Address = "0x20C000000000000000000000b9537d11c60E8b50";
export const ESCROW: Address = "0x4d50500000000000000000000000000000000000";
export const UNIT = 1_000_000n;
export const PATH = "/v1/mpp/chat/completions";

/** Plans over two models; `small` costs 10 base units per input token and 30 per output token. */
export function testGateway(overrides: { free?: boolean } = {}): GatewayConfig {
  return parseGatewayConfig({
    upstreams: [{ id: "fake", baseUrl: "http://127.0.0.1:9/v1" }],
    models: [
      {
        id: "small",
        upstream: "fake",
        upstreamModel: "small-1",
        runtime: "vllm",
        pricing: overrides.free
          ? { inputPerMillion: 0, outputPerMillion: 0 }
          : { inputPerMillion: 10_000_000, outputPerMillion: 30_000_000 },
        maxOutputTokens: 4096,
      },
      {
        id: "big",
        upstream: "fake",
        upstreamModel: "big-1",
        runtime: "ollama",
        pricing: { inputPerMillion: 200_000_000, outputPerMillion: 600_000_000 },
        maxOutputTokens: 8192,
      },
    ],
    plans: {
      Starter: { models: ["small"], default: "small" },
      Plus: { models: ["small", "big"], default: "small" },
      Premium: { models: ["small", "big"], default: "big" },
    },
  });
}

/** Payment settings of a test service whose payee is `recipient`. */
export function testSettings(recipient: Address, overrides: Partial<PaymentSettings> = {}): PaymentSettings {
  return {
    realm: "tollgate-test",
    secret: "test-secret-0123456789abcdef0123456789abcdef",
    chainId: CHAIN_ID,
    currency: USDC_E,
    escrow: ESCROW,
    recipient,
    bucket: UNIT,
    suggestedDeposit: 5n * UNIT,
    challengeTtlSeconds: 300,
    maxCredentialBytes: 16_384,
    reservationTtlSeconds: 300,
    ...overrides,
  };
}

/** A chat body as api-edge would forward it, and the PaidRequest built from it. */
export function paidRequest(
  overrides: Partial<Omit<PaidRequest, "body">> & { content?: string } = {},
): PaidRequest {
  const { content = "Say hello.", ...rest } = overrides;
  const body = Buffer.from(
    JSON.stringify({
      plan: rest.plan ?? "Starter",
      model_optimization: rest.modelOptimization ?? true,
      ...(rest.model ? { model: rest.model } : {}),
      messages: [{ role: "user", content }],
      max_tokens: rest.outputCap ?? 64,
      stream: false,
    }),
  );
  return {
    httpMethod: "POST",
    path: PATH,
    plan: "Starter",
    modelOptimization: true,
    model: "",
    outputCap: 64,
    messageCount: 1,
    body,
    ...rest,
  };
}

/** Signs TIP-1034 vouchers (EIP-712 "TIP20 Channel Reserve"/1) the way the mppx client does. */
export function signVoucher(
  account: PrivateKeyAccount,
  channelId: Hex,
  cumulativeAmount: bigint,
): Promise<Hex> {
  return account.signTypedData({
    domain: { name: "TIP20 Channel Reserve", version: "1", chainId: CHAIN_ID, verifyingContract: ESCROW },
    types: {
      Voucher: [
        { name: "channelId", type: "bytes32" },
        { name: "cumulativeAmount", type: "uint96" },
      ],
    },
    primaryType: "Voucher",
    message: { channelId, cumulativeAmount },
  });
}

/** A payer with one channel to `payee`, building session credentials like the mppx client. */
export class TestPayer {
  readonly account: PrivateKeyAccount;
  readonly descriptor: ChannelDescriptor;
  readonly channelId: Hex;

  constructor(payee: Address, key: Hex = generatePrivateKey()) {
    this.account = privateKeyToAccount(key);
    this.descriptor = {
      payer: this.account.address,
      payee,
      operator: zeroAddress,
      token: USDC_E,
      salt: toHex(randomBytes(32)),
      authorizedSigner: this.account.address,
      expiringNonceHash: keccak256(randomBytes(32)),
    };
    this.channelId = Session.Precompile.Channel.computeId({
      ...this.descriptor,
      chainId: CHAIN_ID,
      escrow: ESCROW,
    });
  }

  get source(): string {
    return `did:pkh:eip155:${CHAIN_ID}:${this.account.address}`;
  }

  /** Opens this payer's channel on `payments` with a first paid request (a voucher of `cumulative`). */
  async openOn(payments: Payments, cumulative: bigint = UNIT): Promise<void> {
    const req = paidRequest();
    await payments.verify({
      authorization: this.credential(payments.challenge(req).header, await this.open(cumulative)),
      httpMethod: "POST",
      path: PATH,
      body: req.body,
    });
  }

  async open(cumulative: bigint, transaction: Hex = "0x76aa"): Promise<Record<string, unknown>> {
    return {
      action: "open",
      type: "transaction",
      channelId: this.channelId,
      transaction,
      signature: await signVoucher(this.account, this.channelId, cumulative),
      descriptor: this.descriptor,
      cumulativeAmount: cumulative.toString(),
      authorizedSigner: this.account.address,
    };
  }

  async voucher(
    cumulative: bigint,
    action: "voucher" | "close" = "voucher",
  ): Promise<Record<string, unknown>> {
    return {
      action,
      channelId: this.channelId,
      descriptor: this.descriptor,
      cumulativeAmount: cumulative.toString(),
      signature: await signVoucher(this.account, this.channelId, cumulative),
    };
  }

  topUp(additional: bigint, transaction: Hex = "0x76bb"): Record<string, unknown> {
    return {
      action: "topUp",
      type: "transaction",
      channelId: this.channelId,
      transaction,
      descriptor: this.descriptor,
      additionalDeposit: additional.toString(),
    };
  }

  /** The Authorization header value for `payload` answering the challenge in `wwwAuthenticate`. */
  credential(
    wwwAuthenticate: string,
    payload: Record<string, unknown>,
    source: string | null = this.source,
  ): string {
    return Credential.serialize({
      challenge: Challenge.deserialize(wwwAuthenticate),
      payload,
      ...(source === null ? {} : { source }),
    });
  }
}

/**
 * A stand-in chain for unit tests: open and top-up checks answer what the test set, channel
 * state is kept in maps, settle and close move it like the precompile does.
 */
export class FakeChain implements Chain {
  canSend = true;
  openDeposit = 5n * UNIT;
  rejectChecks = false;
  failSubmit = false;
  failClose = false;
  readonly states = new Map<Hex, OnChainState>();
  readonly calls: string[] = [];

  private hash(): Hex {
    return toHex(randomBytes(32));
  }

  checkOpen(_tx: Hex, _d: ChannelDescriptor, _id: Hex): { deposit: bigint } {
    this.calls.push("checkOpen");
    if (this.rejectChecks) throw new Error("TIP-1034 open payee does not match challenge.");
    return { deposit: this.openDeposit };
  }

  async submitOpen(_tx: Hex, _d: ChannelDescriptor, id: Hex) {
    this.calls.push("submitOpen");
    if (this.failSubmit) throw new Error("RPC Request failed: expired nonce 0x1234567890abcdef");
    this.states.set(id, { deposit: this.openDeposit, settled: 0n, closeRequestedAt: 0 });
    return { txHash: this.hash(), deposit: this.openDeposit };
  }

  checkTopUp(_tx: Hex, _d: ChannelDescriptor, _id: Hex, _add: bigint): void {
    this.calls.push("checkTopUp");
    if (this.rejectChecks) throw new Error("TIP-1034 topUp descriptor does not match stored channel.");
  }

  async submitTopUp(_tx: Hex, _d: ChannelDescriptor, id: Hex, add: bigint) {
    this.calls.push("submitTopUp");
    if (this.failSubmit) throw new Error("transaction reverted");
    const s = await this.state(id);
    const next = { ...s, deposit: s.deposit + add, closeRequestedAt: 0 };
    this.states.set(id, next);
    return { txHash: this.hash(), deposit: next.deposit };
  }

  async state(id: Hex): Promise<OnChainState> {
    this.calls.push("state");
    return this.states.get(id) ?? { deposit: 0n, settled: 0n, closeRequestedAt: 0 };
  }

  async settle(_d: ChannelDescriptor, id: Hex, v: SignedVoucher) {
    this.calls.push("settle");
    const s = await this.state(id);
    this.states.set(id, { ...s, settled: v.cumulative });
    return { txHash: this.hash(), settled: v.cumulative };
  }

  async close(_d: ChannelDescriptor, id: Hex, _v: SignedVoucher, capture: bigint) {
    this.calls.push("close");
    if (this.failClose) throw new Error("close reverted");
    const s = await this.state(id);
    this.states.set(id, { deposit: 0n, settled: 0n, closeRequestedAt: 0 });
    return { txHash: this.hash(), settledToPayee: capture, refundedToPayer: s.deposit - capture };
  }
}
