import { randomBytes } from "node:crypto";
import { costOf, loadGatewayConfig, type ModelConfig, quoteOf } from "@tollgate/config";
import { expectedUsage } from "@tollgate/testkit/fake-upstream";
import { DEMO_CONFIG } from "@tollgate/testkit/stack";
import { DEMO_PAYER_PRIVATE_KEY, USDC_E } from "@tollgate/testkit/tempo-devnet";
import { type Address, createClient, encodeFunctionData, erc20Abi, type Hex, http } from "viem";
import { type PrivateKeyAccount, privateKeyToAccount } from "viem/accounts";
import {
  prepareTransactionRequest,
  readContract,
  sendRawTransaction,
  signTransaction,
  waitForTransactionReceipt,
} from "viem/actions";
import { tempo } from "viem/chains";

/** The paid route, relative to the gateway's base URL. */
export const PAID_PATH = "/v1/mpp/chat/completions";
/** The challenge amount: the cumulative voucher bucket of the first rollout (1 token unit). */
export const BUCKET = 1_000_000n;

/** Prompt text that must never show up in a log line; unique per run. */
export const PAID_PROMPT_MARKER = `paid-door-marigold-${randomBytes(6).toString("hex")}`;

/** A running gateway the paid-door scenarios talk to. */
export interface PaidTarget {
  /** Base URL, e.g. http://127.0.0.1:8080. */
  url: string;
  /** JSON-RPC URL of the Tempo devnet the gateway settles on (another process: JSON-RPC only). */
  rpcUrl: string;
  /**
   * How many times a model ran so far: completions the upstream received (all-in-one, with the
   * fake upstream in this process) or usage events stored in JetStream (the stack).
   */
  modelRuns(): Promise<number>;
  /** Everything the gateway's processes logged so far (not the demo banner, not the devnet's own banner). */
  logs(): string;
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Wire recording

/** One HTTP exchange as it went over the wire. */
export interface WireEntry {
  method: string;
  path: string;
  authorization: string | undefined;
  body: string;
  status: number;
  contentType: string | undefined;
  /** Problem+json `code` of an error answer. */
  code: string | undefined;
  wwwAuthenticate: string | undefined;
  receipt: string | undefined;
}

function bodyText(body: unknown): string {
  if (body === undefined || body === null) return "";
  if (typeof body === "string") return body;
  if (body instanceof Uint8Array) return Buffer.from(body).toString("utf8");
  if (body instanceof ArrayBuffer) return Buffer.from(body).toString("utf8");
  throw new Error(`unexpected request body type ${Object.prototype.toString.call(body)}`);
}

/** A fetch that records every exchange, for assertions on what was really sent and answered. */
export function wireRecorder() {
  const entries: WireEntry[] = [];
  const fetchFn = (async (input: string | URL | Request, init?: RequestInit) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const headers = new Headers(input instanceof Request ? input.headers : undefined);
    for (const [k, v] of new Headers(init?.headers)) headers.set(k, v);
    const res = await fetch(input, init);
    let code: string | undefined;
    if (res.status >= 400) {
      try {
        const parsed = JSON.parse(await res.clone().text()) as { code?: unknown; error?: { code?: unknown } };
        const c = parsed.code ?? parsed.error?.code;
        if (typeof c === "string") code = c;
      } catch {
        // not JSON: no code
      }
    }
    entries.push({
      method: init?.method ?? (input instanceof Request ? input.method : "GET"),
      path: url.pathname,
      authorization: headers.get("authorization") ?? undefined,
      body: bodyText(init?.body),
      status: res.status,
      contentType: res.headers.get("content-type") ?? undefined,
      code,
      wwwAuthenticate: res.headers.get("www-authenticate") ?? undefined,
      receipt: res.headers.get("payment-receipt") ?? undefined,
    });
    return res;
  }) as typeof globalThis.fetch;
  return { fetch: fetchFn, entries };
}

/** Every secret-ish value the wire carried: credentials, the signatures and transactions inside them, receipts. */
export function wireSecrets(entries: readonly WireEntry[]): string[] {
  const out = new Set<string>();
  for (const e of entries) {
    if (e.receipt) out.add(e.receipt);
    const token = /^\s*payment\s+(\S+)/i.exec(e.authorization ?? "")?.[1];
    if (!token || token.length < 16) continue;
    out.add(token);
    try {
      const wire = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as {
        payload?: Record<string, unknown>;
      };
      for (const key of ["signature", "transaction"]) {
        const v = wire.payload?.[key];
        if (typeof v === "string" && v.length > 20) out.add(v.slice(2).toLowerCase());
      }
    } catch {
      // a deliberately malformed credential
    }
  }
  return [...out];
}

// ---------------------------------------------------------------------------------------------
// Chain access over JSON-RPC (the devnet may live in another process)

function chainClient(rpcUrl: string, account?: PrivateKeyAccount) {
  return createClient({
    ...(account ? { account } : {}),
    chain: tempo,
    transport: http(rpcUrl),
    pollingInterval: 50,
  });
}

/** A viem client for the mppx session manager. */
export function payerClient(rpcUrl: string, account: PrivateKeyAccount) {
  return chainClient(rpcUrl, account);
}

/** USDC.e balance of `address`, read with eth_call balanceOf. */
export async function balanceOf(rpcUrl: string, address: Address): Promise<bigint> {
  return readContract(chainClient(rpcUrl), {
    address: USDC_E,
    abi: erc20Abi,
    functionName: "balanceOf",
    args: [address],
  });
}

/**
 * Funds `to` with a TIP-20 transfer from the demo payer: a signed Tempo (0x76) transaction with
 * an expiring nonce, fees in USDC.e, broadcast with eth_sendRawTransaction.
 */
export async function fund(rpcUrl: string, to: Address, amount: bigint): Promise<void> {
  const from = privateKeyToAccount(DEMO_PAYER_PRIVATE_KEY);
  const client = chainClient(rpcUrl, from);
  const data = encodeFunctionData({ abi: erc20Abi, functionName: "transfer", args: [to, amount] });
  const prepared = await prepareTransactionRequest(client, {
    account: from,
    calls: [{ to: USDC_E, data }],
    nonceKey: "expiring",
    feeToken: USDC_E,
  } as never);
  const serializedTransaction = (await signTransaction(client, {
    ...(prepared as object),
    account: from,
  } as never)) as Hex;
  const hash = await sendRawTransaction(client, { serializedTransaction });
  const receipt = await waitForTransactionReceipt(client, { hash, pollingInterval: 50, timeout: 10_000 });
  if (receipt.status !== "success") throw new Error("funding transfer reverted");
}

// ---------------------------------------------------------------------------------------------
// Prices of the demo configuration (the one both targets run)

const demo = loadGatewayConfig(DEMO_CONFIG);

/** A model of the demo configuration. */
export function demoModel(id: string): ModelConfig {
  const model = demo.models.find((m) => m.id === id);
  if (!model) throw new Error(`no model ${id} in the demo configuration`);
  return model;
}

/** The default model of a demo plan. */
export function planDefault(plan: "Starter" | "Plus" | "Premium"): ModelConfig {
  const p = demo.plans?.[plan];
  if (!p) throw new Error(`no plan ${plan} in the demo configuration`);
  return demoModel(p.default);
}

/** The quote the gateway binds for a one-message body (quoteOf over the exact bytes). */
export function quoteFor(body: string, model: ModelConfig, outputCap: number): bigint {
  return quoteOf(Buffer.byteLength(body, "utf8"), 1, outputCap, model.pricing);
}

/** The cost of what the fake upstream serves for `body` on `model`: what a commit must record. */
export function servedCost(body: Record<string, unknown>, model: ModelConfig): bigint {
  const usage = expectedUsage({ ...body, model: model.upstreamModel });
  return costOf({ inputTokens: usage.prompt_tokens, outputTokens: usage.completion_tokens }, model.pricing);
}
