import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Mppx as MppxClient, tempo as tempoClient } from "mppx/client";
import { Mppx, Store, tempo } from "mppx/server";
import { Session } from "mppx/tempo";
import {
  type Account,
  type Address,
  type Client,
  createClient,
  encodeFunctionData,
  type Hex,
  http,
  parseEventLogs,
  type TransactionReceipt,
} from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import {
  call,
  getBlock,
  getLogs,
  getTransaction,
  getTransactionCount,
  getTransactionReceipt,
  prepareTransactionRequest,
  readContract,
  sendRawTransaction,
  sendRawTransactionSync,
  signTransaction,
  waitForTransactionReceipt,
} from "viem/actions";
import { tempo as tempoChain } from "viem/chains";
import { Abis } from "viem/tempo";
import { afterEach, describe, expect, it } from "vitest";
import {
  CHANNEL_RESERVE,
  createTempoDevnet,
  DEMO_PAYEE_ADDRESS,
  DEMO_PAYEE_PRIVATE_KEY,
  DEMO_PAYER_ADDRESS,
  DEMO_PAYER_PRIVATE_KEY,
  type TempoDevnet,
  USDC_E,
} from "../src/tempo-devnet/index.js";

const escrowAbi = Session.Precompile.escrowAbi;
const UNIT = 1_000_000n;

const running: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((item) => item.close()));
});

async function startDevnet(options: Parameters<typeof createTempoDevnet>[0] = {}): Promise<TempoDevnet> {
  const devnet = await createTempoDevnet(options);
  running.push(devnet);
  return devnet;
}

function chainClient(devnet: TempoDevnet, account: Account): Client {
  return createClient({ account, chain: tempoChain, transport: http(devnet.url), pollingInterval: 50 });
}

/** The mppx reference server: tempo/session, 1 token per request, suggested deposit 5. */
async function startReferenceServer(
  devnet: TempoDevnet,
  payee: Account,
  feePayer?: Account,
): Promise<string> {
  const payeeClient = chainClient(devnet, payee);
  const mppx = Mppx.create({
    methods: [
      tempo.session({
        account: payee,
        currency: devnet.token,
        amount: "1",
        unitType: "request",
        suggestedDeposit: "5",
        chainId: devnet.chainId,
        getClient: () => payeeClient,
        store: Store.memory(),
        ...(feePayer ? { feePayer } : {}),
      }),
    ],
    secretKey: "tollgate-devnet-test-secret-0123456789abcdef",
    realm: "test",
  });
  const listener = Mppx.toNodeListener(mppx.session({}));
  const server: Server = createServer((req, res) => {
    listener(req, res)
      .then((result) => {
        if (result.status === 402) return;
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify({ ok: true }));
      })
      .catch((error: unknown) => {
        res.statusCode = 500;
        res.end(String(error));
      });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  running.push({
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/paid`;
}

/** Prepares (eth_fillTransaction) and signs a Tempo transaction; expiring nonce unless overridden. */
async function signCalls(
  client: Client,
  account: Account,
  calls: Array<{ to: Address; data: Hex }>,
  overrides: Record<string, unknown> = {},
): Promise<Hex> {
  const prepared = await prepareTransactionRequest(client, {
    account,
    calls,
    nonceKey: "expiring",
    feeToken: USDC_E,
    ...overrides,
  } as never);
  return signTransaction(client, { ...prepared, account } as never);
}

async function send(client: Client, raw: Hex): Promise<TransactionReceipt> {
  const hash = await sendRawTransaction(client, { serializedTransaction: raw });
  return waitForTransactionReceipt(client, { hash, timeout: 5_000 });
}

function openCall(payee: Address, deposit: bigint, signer: Address) {
  return {
    to: CHANNEL_RESERVE,
    data: encodeFunctionData({
      abi: escrowAbi,
      functionName: "open",
      args: [
        payee,
        "0x0000000000000000000000000000000000000000",
        USDC_E,
        deposit,
        `0x${"11".repeat(32)}`,
        signer,
      ],
    }),
  };
}

/** Opens a channel with a direct transaction and returns its descriptor and id from the event. */
async function openChannel(client: Client, payer: Account, payee: Address, deposit: bigint) {
  const receipt = await send(
    client,
    await signCalls(client, payer, [openCall(payee, deposit, payer.address)]),
  );
  expect(receipt.status).toBe("success");
  const [opened] = parseEventLogs({ abi: escrowAbi, eventName: "ChannelOpened", logs: receipt.logs });
  if (!opened) throw new Error("no ChannelOpened event");
  const { args } = opened;
  const descriptor = {
    payer: args.payer,
    payee: args.payee,
    operator: args.operator,
    token: args.token,
    salt: args.salt,
    authorizedSigner: args.authorizedSigner,
    expiringNonceHash: args.expiringNonceHash,
  };
  return { receipt, channelId: args.channelId, descriptor };
}

function signVoucher(account: Account, channelId: Hex, cumulativeAmount: bigint): Promise<Hex> {
  if (!account.signTypedData) throw new Error("local account expected");
  return account.signTypedData({
    domain: {
      name: "TIP20 Channel Reserve",
      version: "1",
      chainId: tempoChain.id,
      verifyingContract: CHANNEL_RESERVE,
    },
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

describe("tempo devnet with the unmodified mppx client and the mppx reference server", () => {
  async function runSession(feePerTransaction: bigint) {
    const payer = privateKeyToAccount(generatePrivateKey());
    const payee = privateKeyToAccount(generatePrivateKey());
    const devnet = await startDevnet({
      fundDemoAccounts: false,
      feePerTransaction,
      fund: [
        { address: payer.address, amount: 100n * UNIT },
        { address: payee.address, amount: 1n * UNIT },
      ],
    });
    const url = await startReferenceServer(devnet, payee);
    const manager = tempoClient.session.manager({
      account: payer,
      client: chainClient(devnet, payer),
      maxDeposit: "10",
    });

    // Open (pays the first request), then two vouchers.
    for (let i = 1; i <= 3; i++) {
      const response = await manager.fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ request: i }),
      });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual({ ok: true });
      expect(response.receipt?.spent).toBe(String(BigInt(i) * UNIT));
    }
    const channelId = manager.channelId;
    if (!channelId) throw new Error("manager has no channel");
    expect(devnet.channel(channelId)).toMatchObject({ deposit: 5n * UNIT, settled: 0n, finalized: false });
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(5n * UNIT);

    const closed = await manager.close();
    expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect(closed?.acceptedCumulative).toBe(String(3n * UNIT));

    // The payee got exactly the spend, the payer the rest of the deposit; the only other
    // movements are one fee each (the payer's open, the payee's close).
    expect(devnet.channel(channelId)).toMatchObject({ finalized: true, settled: 3n * UNIT });
    expect(devnet.balanceOf(payee.address)).toBe(1n * UNIT + 3n * UNIT - feePerTransaction);
    expect(devnet.balanceOf(payer.address)).toBe(100n * UNIT - 3n * UNIT - feePerTransaction);
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(0n);
    return devnet;
  }

  it("opens, serves three paid requests and closes with exact balances (no fees)", async () => {
    const devnet = await runSession(0n);
    // The traffic section 5.1 of the protocol notes describes: fill + sign on the client side,
    // dry run, broadcast, receipt and block-pinned reads on the server side.
    expect([...new Set(devnet.rpcLog)].sort()).toEqual([
      "eth_call",
      "eth_chainId",
      "eth_fillTransaction",
      "eth_getTransactionReceipt",
      "eth_sendRawTransaction",
    ]);
  });

  it("accounts a fixed fee to each transaction's sender only", async () => {
    await runSession(2_500n);
  });

  it("runs a fee-sponsored session: the sponsor pays every fee (eth_sendRawTransactionSync)", async () => {
    const payer = privateKeyToAccount(generatePrivateKey());
    const payee = privateKeyToAccount(generatePrivateKey());
    const sponsor = privateKeyToAccount(generatePrivateKey());
    const fee = 1_000n;
    const devnet = await startDevnet({
      fundDemoAccounts: false,
      feePerTransaction: fee,
      fund: [
        { address: payer.address, amount: 20n * UNIT },
        { address: sponsor.address, amount: 1n * UNIT },
      ],
    });
    const url = await startReferenceServer(devnet, payee, sponsor);
    const manager = tempoClient.session.manager({
      account: payer,
      client: chainClient(devnet, payer),
      maxDeposit: "10",
    });
    for (let i = 0; i < 2; i++) {
      expect((await manager.fetch(url, { method: "POST", body: "{}" })).status).toBe(200);
    }
    await manager.close();
    expect(devnet.balanceOf(payer.address)).toBe(18n * UNIT);
    expect(devnet.balanceOf(payee.address)).toBe(2n * UNIT);
    expect(devnet.balanceOf(sponsor.address)).toBe(1n * UNIT - 2n * fee);
    expect(devnet.rpcLog).toContain("eth_sendRawTransactionSync");
  });

  it("also serves the low-level Mppx client fetch", async () => {
    const payer = privateKeyToAccount(DEMO_PAYER_PRIVATE_KEY);
    const payee = privateKeyToAccount(DEMO_PAYEE_PRIVATE_KEY);
    expect([payer.address, payee.address]).toEqual([DEMO_PAYER_ADDRESS, DEMO_PAYEE_ADDRESS]);
    const devnet = await startDevnet();
    expect(devnet.balanceOf(payer.address)).toBe(1000n * UNIT);
    const url = await startReferenceServer(devnet, payee);
    const client = MppxClient.create({
      methods: [
        tempoClient.session({ account: payer, getClient: () => chainClient(devnet, payer), maxDeposit: "5" }),
      ],
      polyfill: false,
    });
    for (let i = 0; i < 2; i++) {
      const response = await client.fetch(url, { method: "POST", body: "{}" });
      expect(response.status).toBe(200);
    }
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(5n * UNIT);
    expect(devnet.balanceOf(payer.address)).toBe(995n * UNIT);
  });
});

describe("tempo devnet transaction rules", () => {
  async function setup() {
    const payer = privateKeyToAccount(generatePrivateKey());
    const payee = privateKeyToAccount(generatePrivateKey());
    const devnet = await startDevnet({
      fund: [
        { address: payer.address, amount: 50n * UNIT },
        { address: payee.address, amount: 1n * UNIT },
      ],
    });
    return {
      devnet,
      payer,
      payee,
      payerClient: chainClient(devnet, payer),
      payeeClient: chainClient(devnet, payee),
    };
  }

  it("rejects an open whose validBefore has passed, and one too far in the future", async () => {
    const { devnet, payer, payee, payerClient } = await setup();
    const raw = await signCalls(payerClient, payer, [openCall(payee.address, 5n * UNIT, payer.address)]);
    devnet.setTimeOffset(60);
    await expect(sendRawTransaction(payerClient, { serializedTransaction: raw })).rejects.toThrow(/expired/);
    devnet.setTimeOffset(0);
    const tooLate = await signCalls(payerClient, payer, [openCall(payee.address, 5n * UNIT, payer.address)], {
      validBefore: Math.floor(Date.now() / 1000) + 45,
    });
    await expect(sendRawTransaction(payerClient, { serializedTransaction: tooLate })).rejects.toThrow(
      /too far in the future/,
    );
    // Nothing moved, and the same transaction is still good inside its window.
    expect(devnet.balanceOf(payer.address)).toBe(50n * UNIT);
    expect((await send(payerClient, raw)).status).toBe("success");
    expect(devnet.balanceOf(payer.address)).toBe(45n * UNIT);
  });

  it("rejects a replayed raw transaction", async () => {
    const { devnet, payer, payee, payerClient } = await setup();
    const raw = await signCalls(payerClient, payer, [openCall(payee.address, 5n * UNIT, payer.address)]);
    const receipt = await sendRawTransactionSync(payerClient, { serializedTransaction: raw });
    expect(receipt.status).toBe("success");
    await expect(sendRawTransaction(payerClient, { serializedTransaction: raw })).rejects.toThrow(
      /already known/,
    );
    expect(devnet.balanceOf(payer.address)).toBe(45n * UNIT);
  });

  it("holds transactions while mining is paused and drops one whose validBefore passed meanwhile", async () => {
    const { devnet, payer, payee, payerClient } = await setup();
    const raw = await signCalls(payerClient, payer, [openCall(payee.address, 5n * UNIT, payer.address)]);
    devnet.pauseMining(300);
    const hash = await sendRawTransaction(payerClient, { serializedTransaction: raw });
    expect(await getTransactionReceipt(payerClient, { hash }).catch(() => null)).toBeNull();
    const balance = await readContract(payerClient, {
      address: USDC_E,
      abi: Abis.tip20,
      functionName: "balanceOf",
      args: [payer.address],
    });
    expect(balance).toBe(50n * UNIT);
    devnet.setTimeOffset(60);
    await new Promise((resolve) => setTimeout(resolve, 500));
    await expect(getTransactionReceipt(payerClient, { hash })).rejects.toThrow(/could not be found/);
    expect(devnet.balanceOf(payer.address)).toBe(50n * UNIT);
  });

  it("reverts a settle with a bad voucher signature, then settles a good one", async () => {
    const { devnet, payer, payee, payerClient, payeeClient } = await setup();
    const {
      channelId,
      descriptor,
      receipt: openReceipt,
    } = await openChannel(payerClient, payer, payee.address, 5n * UNIT);
    expect(channelId).toBe(Session.Precompile.Channel.computeId({ ...descriptor, chainId: devnet.chainId }));

    // Block-pinned reads: nothing before the open block, the deposit from it on.
    const before = await readContract(payeeClient, {
      address: CHANNEL_RESERVE,
      abi: escrowAbi,
      functionName: "getChannelState",
      args: [channelId],
      blockNumber: openReceipt.blockNumber - 1n,
    });
    expect(before.deposit).toBe(0n);
    const at = await readContract(payeeClient, {
      address: CHANNEL_RESERVE,
      abi: escrowAbi,
      functionName: "getChannel",
      args: [descriptor],
      blockNumber: openReceipt.blockNumber,
    });
    expect(at.state).toEqual({ settled: 0n, deposit: 5n * UNIT, closeRequestedAt: 0 });
    await expect(getBlock(payeeClient, { blockNumber: openReceipt.blockNumber + 100n })).rejects.toThrow();

    const stranger = privateKeyToAccount(generatePrivateKey());
    const badSignature = await signVoucher(stranger, channelId, 2n * UNIT);
    const settleBad = {
      to: CHANNEL_RESERVE,
      data: encodeFunctionData({
        abi: escrowAbi,
        functionName: "settle",
        args: [descriptor, 2n * UNIT, badSignature],
      }),
    };
    // A dry run reports the precompile's InvalidSignature error...
    await expect(call(payeeClient, { account: payee, ...settleBad })).rejects.toThrow(/InvalidSignature/);
    // ...and mined anyway (gas and fees given, so no fill), the transaction reverts.
    const block = await getBlock(payeeClient);
    const raw = await signCalls(payeeClient, payee, [settleBad], {
      chainId: devnet.chainId,
      gas: 300_000n,
      maxFeePerGas: (block.baseFeePerGas ?? 0n) * 2n,
      maxPriorityFeePerGas: 0n,
    });
    const reverted = await send(payeeClient, raw);
    expect(reverted.status).toBe("reverted");
    expect(reverted.logs).toEqual([]);
    expect(devnet.balanceOf(payee.address)).toBe(1n * UNIT);

    // The good voucher goes in a protocol-nonce (not expiring) transaction.
    const goodSignature = await signVoucher(payer, channelId, 2n * UNIT);
    const settleGood = {
      to: CHANNEL_RESERVE,
      data: encodeFunctionData({
        abi: escrowAbi,
        functionName: "settle",
        args: [descriptor, 2n * UNIT, goodSignature],
      }),
    };
    const settled = await send(
      payeeClient,
      await signCalls(payeeClient, payee, [settleGood], { nonceKey: undefined }),
    );
    expect(settled.status).toBe("success");
    expect(await getTransactionCount(payeeClient, { address: payee.address })).toBe(1);
    const mined = await getTransaction(payeeClient, { hash: settled.transactionHash });
    expect(mined.from.toLowerCase()).toBe(payee.address.toLowerCase());
    expect(mined.blockNumber).toBe(settled.blockNumber);
    const [event] = parseEventLogs({ abi: escrowAbi, eventName: "Settled", logs: settled.logs });
    expect(event?.args).toMatchObject({ channelId, deltaPaid: 2n * UNIT, newSettled: 2n * UNIT });
    expect(devnet.balanceOf(payee.address)).toBe(3n * UNIT);
    expect(devnet.channel(channelId)).toMatchObject({ settled: 2n * UNIT, deposit: 5n * UNIT });
    const logs = await getLogs(payeeClient, {
      address: CHANNEL_RESERVE,
      events: escrowAbi.filter((item) => item.type === "event"),
      fromBlock: 0n,
    });
    expect(logs.map((log) => log.eventName)).toEqual(["ChannelOpened", "Settled"]);
  });

  it("lets the payer withdraw only after requestClose and the grace period", async () => {
    const { devnet, payer, payee, payerClient } = await setup();
    const { channelId, descriptor } = await openChannel(payerClient, payer, payee.address, 5n * UNIT);
    const requestClose = {
      to: CHANNEL_RESERVE,
      data: encodeFunctionData({ abi: escrowAbi, functionName: "requestClose", args: [descriptor] }),
    };
    const requested = await send(payerClient, await signCalls(payerClient, payer, [requestClose]));
    const [event] = parseEventLogs({ abi: escrowAbi, eventName: "CloseRequested", logs: requested.logs });
    expect(event?.args.channelId).toBe(channelId);
    const withdraw = {
      to: CHANNEL_RESERVE,
      data: encodeFunctionData({ abi: escrowAbi, functionName: "withdraw", args: [descriptor] }),
    };
    await expect(call(payerClient, { account: payer, ...withdraw })).rejects.toThrow(/CloseNotReady/);
    devnet.setTimeOffset(901);
    const raw = await signCalls(payerClient, payer, [withdraw], {
      validBefore: Math.floor(Date.now() / 1000) + 901 + 20,
    });
    expect((await send(payerClient, raw)).status).toBe("success");
    expect(devnet.balanceOf(payer.address)).toBe(50n * UNIT);
    expect(devnet.channel(channelId)?.finalized).toBe(true);
  });

  it("answers unknown methods with -32601", async () => {
    const devnet = await startDevnet();
    const response = await fetch(devnet.url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 7, method: "eth_mining", params: [] }),
    });
    expect(await response.json()).toMatchObject({ id: 7, error: { code: -32601 } });
  });
});
