import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Address, Hex } from "viem";
import { DevnetChain, RpcError } from "./chain.js";
import { CHANNEL_RESERVE, TEMPO_CHAIN_ID, USDC_E } from "./constants.js";
import {
  DEMO_PAYEE_ADDRESS,
  DEMO_PAYEE_FUNDING,
  DEMO_PAYER_ADDRESS,
  DEMO_PAYER_FUNDING,
} from "./demo-accounts.js";
import { dispatch } from "./rpc.js";
import type { ChannelDescriptor } from "./state.js";

export { type DevnetBlock, type DevnetReceipt, RpcError } from "./chain.js";
export {
  BASE_FEE_PER_GAS,
  CHANNEL_RESERVE,
  CLOSE_GRACE_PERIOD,
  FEE_MANAGER,
  MAX_VALID_BEFORE_WINDOW,
  PATH_USD,
  TEMPO_CHAIN_ID,
  TOKEN_DECIMALS,
  USDC_E,
} from "./constants.js";
export * from "./demo-accounts.js";
export { computeChannelId, voucherDigest } from "./execute.js";
export type { ChannelDescriptor } from "./state.js";

/** Options of {@link createTempoDevnet}. */
export interface TempoDevnetOptions {
  /** Default 0: a free port. */
  port?: number;
  /** Default 127.0.0.1. */
  host?: string;
  /** Extra genesis balances; `token` defaults to USDC.e. */
  fund?: Array<{ address: Address; amount: bigint; token?: Address }>;
  /** Fund the demo payer (1000 USDC.e) and demo payee (10 USDC.e) at genesis. Default true. */
  fundDemoAccounts?: boolean;
  /**
   * Fixed fee per transaction, in base units of the transaction's fee token (USDC.e when the
   * transaction names none), debited from the fee payer (the sender, or its sponsor) and
   * credited to the fee manager; charged on reverted transactions too. Never touches channel
   * amounts. Default 0: every balance change is then exactly a token or channel movement.
   */
  feePerTransaction?: bigint;
}

/** A channel as the devnet's TIP-1034 precompile holds it. */
export interface DevnetChannel {
  channelId: Hex;
  descriptor: ChannelDescriptor;
  deposit: bigint;
  settled: bigint;
  /** Block timestamp of the payer's requestClose; 0 when none is pending. */
  closeRequestedAt: number;
  /** Closed or withdrawn; the precompile then reports a zero state for the id. */
  finalized: boolean;
}

/** A running Tempo devnet. */
export interface TempoDevnet {
  /** JSON-RPC endpoint, e.g. http://127.0.0.1:18545. */
  readonly url: string;
  readonly port: number;
  /** 4217, Tempo mainnet's id. */
  readonly chainId: number;
  /** The session currency: USDC.e. */
  readonly token: Address;
  /** The TIP-1034 channel reserve precompile address. */
  readonly escrow: Address;
  /** Fee charged per transaction (see {@link TempoDevnetOptions.feePerTransaction}). */
  readonly feePerTransaction: bigint;
  /** Latest TIP-20 balance of `address` in `token` (default USDC.e). */
  balanceOf(address: Address, token?: Address): bigint;
  /** The channel record for `channelId`, undefined when it was never opened. */
  channel(channelId: Hex): DevnetChannel | undefined;
  /** Mints `amount` of `token` (default USDC.e) to `address` in a new block. */
  fund(address: Address, amount: bigint, token?: Address): void;
  /** Sets the devnet clock to wall clock + `seconds` (absolute offset); block timestamps never go back. */
  setTimeOffset(seconds: number): void;
  /** Holds accepted transactions for `ms`, then mines them; ones whose validBefore passed are dropped. */
  pauseMining(ms: number): void;
  /** Number of the newest block. */
  blockNumber(): bigint;
  /** JSON-RPC method names received, oldest first (at most the last 1000). */
  readonly rpcLog: readonly string[];
  /** Stops listening and destroys open connections. */
  close(): Promise<void>;
}

const MAX_BODY_BYTES = 1024 * 1024;
const RPC_LOG_LIMIT = 1000;

interface JsonRpcRequest {
  jsonrpc?: unknown;
  id?: unknown;
  method?: unknown;
  params?: unknown;
}

/** Starts a Tempo devnet: a JSON-RPC server on loopback with instant sealing and genesis funding. */
export async function createTempoDevnet(options: TempoDevnetOptions = {}): Promise<TempoDevnet> {
  const genesis = [
    ...(options.fundDemoAccounts === false
      ? []
      : [
          { address: DEMO_PAYER_ADDRESS, amount: DEMO_PAYER_FUNDING },
          { address: DEMO_PAYEE_ADDRESS, amount: DEMO_PAYEE_FUNDING },
        ]),
    ...(options.fund ?? []),
  ];
  const chain = new DevnetChain({
    genesis,
    ...(options.feePerTransaction === undefined ? {} : { feePerTransaction: options.feePerTransaction }),
  });
  const rpcLog: string[] = [];

  const answer = async (request: JsonRpcRequest) => {
    const id = request.id ?? null;
    if (typeof request.method !== "string") {
      return { jsonrpc: "2.0", id, error: { code: -32600, message: "invalid request" } };
    }
    rpcLog.push(request.method);
    if (rpcLog.length > RPC_LOG_LIMIT) rpcLog.shift();
    try {
      return { jsonrpc: "2.0", id, result: await dispatch(chain, request.method, request.params) };
    } catch (error) {
      const rpc =
        error instanceof RpcError
          ? error
          : new RpcError(-32603, `internal error: ${(error as Error).message}`);
      return {
        jsonrpc: "2.0",
        id,
        error: {
          code: rpc.code,
          message: rpc.message,
          ...(rpc.data === undefined ? {} : { data: rpc.data }),
        },
      };
    }
  };

  const server = createServer((req, res) => {
    handleHttp(req, res, answer).catch((error: unknown) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32603, message: String(error) } }));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port, address } = server.address() as AddressInfo;
  const host = address.includes(":") ? `[${address}]` : address;

  return {
    url: `http://${host}:${port}`,
    port,
    chainId: TEMPO_CHAIN_ID,
    token: USDC_E,
    escrow: CHANNEL_RESERVE,
    feePerTransaction: chain.feePerTransaction,
    rpcLog,
    balanceOf: (account, token = USDC_E) => chain.current.balanceOf(token, account),
    channel: (channelId) => {
      const record = chain.current.channel(channelId);
      return record ? { channelId: channelId.toLowerCase() as Hex, ...record } : undefined;
    },
    fund: (account, amount, token) => chain.fund(account, amount, token),
    setTimeOffset: (seconds) => chain.setTimeOffset(seconds),
    pauseMining: (ms) => chain.pauseMining(ms),
    blockNumber: () => chain.latest.number,
    close: () =>
      new Promise<void>((resolve) => {
        chain.close();
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

async function handleHttp(
  req: IncomingMessage,
  res: ServerResponse,
  answer: (request: JsonRpcRequest) => Promise<unknown>,
): Promise<void> {
  if (req.method !== "POST") {
    res.writeHead(405, { allow: "POST", "content-type": "application/json" });
    res.end(JSON.stringify({ error: "JSON-RPC over POST only" }));
    return;
  }
  const chunks: Buffer[] = [];
  let length = 0;
  for await (const chunk of req) {
    length += (chunk as Buffer).length;
    if (length > MAX_BODY_BYTES) {
      res.writeHead(413, { "content-type": "application/json" });
      res.end(
        JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32600, message: "request too large" } }),
      );
      return;
    }
    chunks.push(chunk as Buffer);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32700, message: "parse error" } }));
    return;
  }
  const response = Array.isArray(body)
    ? await Promise.all(body.map((item) => answer((item ?? {}) as JsonRpcRequest)))
    : await answer((body ?? {}) as JsonRpcRequest);
  res.writeHead(200, { "content-type": "application/json" });
  res.end(JSON.stringify(response));
}
