import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import {
  CHANNEL_RESERVE,
  createTempoDevnet,
  type TempoDevnet,
  type TempoDevnetOptions,
} from "@tollgate/testkit/tempo-devnet";
import { Credential } from "mppx";
import { Mppx, Store, tempo } from "mppx/server";
import { type Account, createClient, type Hex, http } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { tempo as tempoChain } from "viem/chains";
import { afterEach, describe, expect, it } from "vitest";
import {
  answerText,
  MPP_CHAT_PATH,
  PaidSession,
  PaidSessionError,
  type PaidSessionEvent,
} from "../src/paid-session.js";

const UNIT = 1_000_000n;
const REFRESH_REQUIRED = "mpp_voucher_bucket_refresh_required";
const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, "../../..");
const cliPath = resolve(here, "../src/cli.ts");

const running: Array<() => Promise<void>> = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((stop) => stop()));
});

/** A credential the server received, decoded (what the client sent on the wire). */
interface SeenCredential {
  action: string;
  cumulativeAmount?: string;
  signature?: Hex;
  challengeId: string;
  hasBody: boolean;
  status: number;
}

interface PaidServerOptions {
  /**
   * "reference": the mppx reference server as is: it charges `amount` (1 token) per content request.
   * "bucket": the gateway's behaviour in front of it: a voucher of cumulative `amount` is a prepaid
   * bucket that pays `requestsPerBucket` requests; a reused voucher on an exhausted bucket gets 402
   * problem+json { code: "mpp_voucher_bucket_refresh_required" } with a fresh challenge.
   */
  mode: "reference" | "bucket";
  requestsPerBucket?: number;
  suggestedDeposit?: string;
  /** Replaces the answer to a paid content request (to test failure paths). */
  override?: (paidRequestNo: number) => { status: number; body: unknown; challenge?: boolean } | undefined;
  /** Drops the Payment-Receipt of a paid 200 with this number. */
  dropReceiptOf?: number;
}

interface PaidServer {
  baseUrl: string;
  seen: SeenCredential[];
  /** Paid content requests served with 200, in order. */
  served: number;
}

function chainClient(devnet: TempoDevnet, account: Account) {
  return createClient({ account, chain: tempoChain, transport: http(devnet.url), pollingInterval: 50 });
}

async function startDevnet(fund: TempoDevnetOptions["fund"]): Promise<TempoDevnet> {
  const devnet = await createTempoDevnet({ fundDemoAccounts: false, fund: fund ?? [] });
  running.push(() => devnet.close());
  return devnet;
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolveBody, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => resolveBody(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

async function send(res: ServerResponse, response: Response): Promise<void> {
  res.statusCode = response.status;
  response.headers.forEach((value, name) => {
    res.setHeader(name, value);
  });
  res.end(Buffer.from(await response.arrayBuffer()));
}

function completion(prompt: string) {
  return {
    id: "chatcmpl-test",
    object: "chat.completion",
    created: 1,
    model: "test-model",
    choices: [
      { index: 0, message: { role: "assistant", content: `echo: ${prompt}` }, finish_reason: "stop" },
    ],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  };
}

/** The mppx reference server (tempo/session, 1 token per unit) behind POST /v1/mpp/chat/completions. */
async function startPaidServer(
  devnet: TempoDevnet,
  payee: Account,
  options: PaidServerOptions,
): Promise<PaidServer> {
  const payeeClient = chainClient(devnet, payee);
  const mppx = Mppx.create({
    methods: [
      tempo.session({
        account: payee,
        currency: devnet.token,
        amount: "1",
        unitType: "request",
        suggestedDeposit: options.suggestedDeposit ?? "5",
        chainId: devnet.chainId,
        getClient: () => payeeClient,
        store: Store.memory(),
      }),
    ],
    secretKey: "tollgate-agent-client-test-secret-0123456789",
    realm: "test",
  });
  const handler = mppx.session({});
  const buckets = new Map<string, { top: bigint; used: number }>();
  const state: PaidServer = { baseUrl: "", seen: [], served: 0 };
  let paidContent = 0;

  /** Runs the reference server on a web Request; management answers (204) come back as they are. */
  async function reference(url: string, headers: Headers, body: Buffer | undefined, respond: () => Response) {
    const result = await handler(
      new Request(url, { method: "POST", headers, ...(body && body.length > 0 ? { body } : {}) }),
    );
    if (result.status === 402) return result.challenge;
    try {
      return result.withReceipt();
    } catch {
      return result.withReceipt(respond());
    }
  }

  async function serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = `http://${req.headers.host}${req.url}`;
    if (req.method !== "POST" || new URL(url).pathname !== MPP_CHAT_PATH) {
      res.statusCode = 404;
      res.end();
      return;
    }
    const body = await readBody(req);
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
      if (typeof value === "string" && name !== "content-length" && name !== "host") headers.set(name, value);
    }
    const prompt =
      body.length > 0
        ? String(
            (JSON.parse(body.toString()) as { messages?: Array<{ content?: unknown }> }).messages?.[0]
              ?.content,
          )
        : "";
    const chat = () => Response.json(completion(prompt));
    const authorization = headers.get("authorization");
    if (!authorization) {
      await send(res, await reference(url, headers, body, chat));
      return;
    }
    const credential = Credential.deserialize(authorization);
    const payload = credential.payload as {
      action: string;
      channelId: Hex;
      cumulativeAmount?: string;
      signature?: Hex;
    };
    const seen: SeenCredential = {
      action: payload.action,
      challengeId: credential.challenge.id,
      hasBody: body.length > 0,
      status: 0,
      ...(payload.cumulativeAmount !== undefined ? { cumulativeAmount: payload.cumulativeAmount } : {}),
      ...(payload.signature !== undefined ? { signature: payload.signature } : {}),
    };
    state.seen.push(seen);
    const isContent = body.length > 0 && (payload.action === "open" || payload.action === "voucher");
    let response: Response;

    const scripted = isContent ? options.override?.(paidContent + 1) : undefined;
    if (scripted) {
      paidContent++;
      const challenge = scripted.challenge
        ? (await reference(url, new Headers({ "content-type": "application/json" }), body, chat)).headers.get(
            "www-authenticate",
          )
        : null;
      response = Response.json(scripted.body, {
        status: scripted.status,
        headers: {
          "content-type": "application/problem+json",
          ...(challenge ? { "www-authenticate": challenge } : {}),
        },
      });
    } else if (options.mode === "bucket" && isContent) {
      paidContent++;
      const key = payload.channelId.toLowerCase();
      const cumulative = BigInt(payload.cumulativeAmount ?? "0");
      const bucket = buckets.get(key);
      const perBucket = options.requestsPerBucket ?? 3;
      if (bucket && cumulative === bucket.top && bucket.used >= perBucket) {
        // Exhausted bucket: the gateway's refresh-required answer, with a fresh challenge.
        const fresh = await reference(url, new Headers({ "content-type": "application/json" }), body, chat);
        response = Response.json(
          {
            type: "https://paymentauth.org/problems/payment-insufficient",
            title: REFRESH_REQUIRED,
            status: 402,
            detail: "sign a higher cumulative voucher",
            code: REFRESH_REQUIRED,
          },
          {
            status: 402,
            headers: {
              "content-type": "application/problem+json",
              "www-authenticate": fresh.headers.get("www-authenticate") ?? "",
            },
          },
        );
      } else if (bucket && cumulative === bucket.top) {
        // Reused voucher, bucket not exhausted: the reference server accepts the equal voucher
        // idempotently as a management update (no charge); the wrapper serves the content.
        const management = await reference(url, headers, undefined, chat);
        if (management.status === 204) {
          bucket.used++;
          response = new Response(JSON.stringify(completion(prompt)), {
            status: 200,
            headers: {
              "content-type": "application/json",
              "payment-receipt": management.headers.get("payment-receipt") ?? "",
            },
          });
        } else response = management;
      } else {
        // A new bucket (open or a raised voucher): the reference server charges one `amount`.
        response = await reference(url, headers, body, chat);
        if (response.status === 200) buckets.set(key, { top: cumulative, used: 1 });
      }
    } else {
      if (isContent) paidContent++;
      response = await reference(url, headers, body, chat);
    }

    if (isContent && response.status === 200) {
      state.served++;
      if (options.dropReceiptOf === state.served) {
        const stripped = new Headers(response.headers);
        stripped.delete("payment-receipt");
        response = new Response(await response.arrayBuffer(), { status: 200, headers: stripped });
      }
    }
    seen.status = response.status;
    await send(res, response);
  }

  const server: Server = createServer((req, res) => {
    serve(req, res).catch((error: unknown) => {
      res.statusCode = 500;
      res.end(String(error));
    });
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  running.push(
    () =>
      new Promise<void>((done) => {
        server.close(() => done());
        server.closeAllConnections();
      }),
  );
  state.baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return state;
}

async function setup(options: PaidServerOptions, payerFunds = 100n * UNIT) {
  const payerKey = generatePrivateKey();
  const payer = privateKeyToAccount(payerKey);
  const payee = privateKeyToAccount(generatePrivateKey());
  const devnet = await startDevnet([
    { address: payer.address, amount: payerFunds },
    { address: payee.address, amount: 1n * UNIT },
  ]);
  const server = await startPaidServer(devnet, payee, options);
  return { devnet, server, payer, payee, payerKey };
}

function chatBody(content: string) {
  return {
    plan: "Starter",
    model_optimization: true,
    messages: [{ role: "user", content }],
    max_tokens: 16,
  };
}

describe("PaidSession against the mppx reference server on the Tempo devnet", () => {
  it("reuses one voucher across requests until refresh is required, then raises it, then closes", async () => {
    const { devnet, server, payer, payee, payerKey } = await setup({ mode: "bucket", requestsPerBucket: 3 });
    const events: PaidSessionEvent[] = [];
    const session = new PaidSession({
      url: server.baseUrl,
      privateKey: payerKey,
      rpcUrl: devnet.url,
      onEvent: (event) => events.push(event),
    });
    expect(session.payer).toBe(payer.address);

    const responses = [];
    for (let i = 1; i <= 5; i++) responses.push(await session.chat(chatBody(`question ${i}`)));

    expect(responses.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
    expect(responses.map((r) => r.voucher)).toEqual(["opened", "reused", "reused", "raised", "reused"]);
    expect(responses.map((r) => answerText(r.body))).toEqual([
      "echo: question 1",
      "echo: question 2",
      "echo: question 3",
      "echo: question 4",
      "echo: question 5",
    ]);
    expect(responses.map((r) => r.receipt.spent)).toEqual(
      ["1", "1", "1", "2", "2"].map((n) => String(BigInt(n) * UNIT)),
    );
    expect(responses.map((r) => r.receipt.acceptedCumulative)).toEqual(
      ["1", "1", "1", "2", "2"].map((n) => String(BigInt(n) * UNIT)),
    );
    expect(responses[3]?.attempts.map((a) => [a.action, a.status, a.code])).toEqual([
      ["reuse", 402, REFRESH_REQUIRED],
      ["raise", 200, undefined],
    ]);

    // On the wire: requests 2 and 3 carry the open's voucher unchanged (same cumulative amount,
    // same signature) in a credential for their own fresh challenge.
    const content = server.seen.filter((c) => c.hasBody);
    expect(content.map((c) => [c.action, c.cumulativeAmount, c.status])).toEqual([
      ["open", String(UNIT), 200],
      ["voucher", String(UNIT), 200],
      ["voucher", String(UNIT), 200],
      ["voucher", String(UNIT), 402],
      ["voucher", String(2n * UNIT), 200],
      ["voucher", String(2n * UNIT), 200],
    ]);
    const [open, second, third] = content;
    expect(second?.signature).toBe(open?.signature);
    expect(third?.signature).toBe(open?.signature);
    expect(new Set(content.map((c) => c.challengeId)).size).toBe(content.length);
    expect(devnet.channel(session.channelId!)).toMatchObject({
      deposit: 5n * UNIT,
      settled: 0n,
      finalized: false,
    });

    const closed = await session.close();
    expect(closed).toMatchObject({ spent: 2n * UNIT, cumulativeAmount: 2n * UNIT, deposit: 5n * UNIT });
    expect(closed?.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect(server.seen.at(-1)).toMatchObject({
      action: "close",
      cumulativeAmount: String(2n * UNIT),
      hasBody: false,
      status: 204,
    });
    // The payee got exactly what the server charged (two buckets), the payer the rest.
    expect(devnet.channel(closed!.channelId)).toMatchObject({ finalized: true, settled: 2n * UNIT });
    expect(devnet.balanceOf(payee.address)).toBe(1n * UNIT + 2n * UNIT);
    expect(devnet.balanceOf(payer.address)).toBe(100n * UNIT - 2n * UNIT);
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(0n);
    expect(events.filter((e) => e.type === "open")).toHaveLength(1);
    expect(events.filter((e) => e.type === "raise")).toHaveLength(1);
    await expect(session.chat(chatBody("after close"))).rejects.toMatchObject({ code: "session_closed" });
  });

  it("with voucherEachRequest signs a new, higher voucher for every request, as mppx pays", async () => {
    const { devnet, server, payerKey } = await setup({ mode: "bucket", requestsPerBucket: 3 });
    const session = new PaidSession({
      url: server.baseUrl,
      privateKey: payerKey,
      rpcUrl: devnet.url,
      voucherEachRequest: true,
    });
    const responses = [];
    for (let i = 1; i <= 3; i++) responses.push(await session.chat(chatBody(`each ${i}`)));
    expect(responses.map((r) => r.voucher)).toEqual(["opened", "raised", "raised"]);
    // Each voucher is the spend so far plus one amount: the server charged a bucket for each.
    expect(server.seen.filter((c) => c.hasBody).map((c) => [c.action, c.cumulativeAmount, c.status])).toEqual(
      [
        ["open", String(UNIT), 200],
        ["voucher", String(2n * UNIT), 200],
        ["voucher", String(3n * UNIT), 200],
      ],
    );
    expect(responses.map((r) => r.receipt.spent)).toEqual([UNIT, 2n * UNIT, 3n * UNIT].map(String));
    const closed = await session.close();
    expect(closed).toMatchObject({ spent: 3n * UNIT, cumulativeAmount: 3n * UNIT });
  });

  it("treats the reference server's insufficient balance like a refresh and tops up past the deposit", async () => {
    const { devnet, server, payer, payee, payerKey } = await setup({
      mode: "reference",
      suggestedDeposit: "2",
    });
    const session = new PaidSession({
      url: server.baseUrl,
      privateKey: payerKey,
      rpcUrl: devnet.url,
      maxDeposit: 10n * UNIT,
    });
    const responses = [];
    for (let i = 1; i <= 3; i++) responses.push(await session.chat(chatBody(`q${i}`)));
    expect(responses.map((r) => r.voucher)).toEqual(["opened", "raised", "raised"]);
    expect(responses.map((r) => r.receipt.spent)).toEqual([UNIT, 2n * UNIT, 3n * UNIT].map(String));
    // The reference server charges a full amount per request, so each reuse attempt is answered
    // 402 session/insufficient-balance before the raise; the third raise needs a top-up first.
    expect(server.seen.map((c) => [c.action, c.cumulativeAmount, c.status])).toEqual([
      ["open", String(UNIT), 200],
      ["voucher", String(UNIT), 402],
      ["voucher", String(2n * UNIT), 200],
      ["voucher", String(2n * UNIT), 402],
      ["topUp", undefined, 204],
      ["voucher", String(3n * UNIT), 200],
    ]);
    expect(responses[1]?.attempts.map((a) => a.code)).toEqual(["session/insufficient-balance", undefined]);
    expect(session.deposit).toBe(4n * UNIT);
    expect(devnet.channel(session.channelId!)).toMatchObject({ deposit: 4n * UNIT });

    const closed = await session.close();
    expect(closed).toMatchObject({ spent: 3n * UNIT, deposit: 4n * UNIT });
    expect(devnet.balanceOf(payee.address)).toBe(1n * UNIT + 3n * UNIT);
    expect(devnet.balanceOf(payer.address)).toBe(100n * UNIT - 3n * UNIT);
    expect(devnet.balanceOf(CHANNEL_RESERVE)).toBe(0n);
  });

  it("stops on a 200 without a receipt and on a stop code, never looping, and still closes", async () => {
    const { devnet, server, payer, payerKey } = await setup({
      mode: "bucket",
      dropReceiptOf: 2,
      override: (n) =>
        n === 4 ? { status: 402, challenge: true, body: { code: "mpp_body_digest_mismatch" } } : undefined,
    });
    const session = new PaidSession({ url: server.baseUrl, privateKey: payerKey, rpcUrl: devnet.url });
    expect((await session.chat(chatBody("one"))).voucher).toBe("opened");
    const missing = await session.chat(chatBody("two")).catch((error: unknown) => error);
    expect(missing).toBeInstanceOf(PaidSessionError);
    expect(missing).toMatchObject({ code: "receipt_missing" });
    expect((await session.chat(chatBody("three"))).voucher).toBe("reused");
    const before = server.seen.length;
    const stopped = await session.chat(chatBody("four")).catch((error: unknown) => error);
    expect(stopped).toMatchObject({
      code: "payment_rejected",
      details: { status: 402, serverCode: "mpp_body_digest_mismatch" },
    });
    expect(server.seen.length - before).toBe(1);

    // Bounded retries: a server that always asks for a refresh gets at most 3 paid attempts.
    const greedy = await setup({
      mode: "bucket",
      override: (n) =>
        n >= 2 ? { status: 402, challenge: true, body: { code: REFRESH_REQUIRED } } : undefined,
    });
    const greedySession = new PaidSession({
      url: greedy.server.baseUrl,
      privateKey: greedy.payerKey,
      rpcUrl: greedy.devnet.url,
    });
    await greedySession.chat(chatBody("one"));
    await expect(greedySession.chat(chatBody("two"))).rejects.toMatchObject({ code: "retries_exhausted" });
    expect(greedy.server.seen.filter((c) => c.hasBody)).toHaveLength(1 + 3);

    const closed = await session.close();
    expect(closed?.spent).toBe(UNIT);
    expect(devnet.balanceOf(payer.address)).toBe(100n * UNIT - UNIT);
  });
});

describe("tollgate-pay CLI", () => {
  const run = promisify(execFile);
  const tsx = join(repoRoot, "node_modules/.bin/tsx");

  async function cli(args: string[], env: Record<string, string> = {}) {
    try {
      const { stdout, stderr } = await run(tsx, [cliPath, ...args], {
        cwd: repoRoot,
        env: { ...process.env, ...env },
        timeout: 30_000,
      });
      return { code: 0, stdout, stderr };
    } catch (error) {
      const failed = error as { code?: number; stdout?: string; stderr?: string };
      return { code: failed.code ?? 1, stdout: failed.stdout ?? "", stderr: failed.stderr ?? "" };
    }
  }

  it("pays three requests on one voucher and closes; resumes and closes from a state file", {
    timeout: 120_000,
  }, async () => {
    const { devnet, server, payer, payee, payerKey } = await setup({ mode: "bucket", requestsPerBucket: 3 });
    const dir = mkdtempSync(join(tmpdir(), "tollgate-pay-"));
    running.push(async () => rmSync(dir, { recursive: true, force: true }));
    const keyFile = join(dir, "payer.key");
    writeFileSync(keyFile, `${payerKey}\n`, { mode: 0o600 });
    const common = [
      "--url",
      server.baseUrl,
      "--rpc",
      devnet.url,
      "--key-file",
      keyFile,
      "--max-tokens",
      "16",
    ];

    const first = await cli([
      "chat",
      ...common,
      "--plan",
      "Starter",
      "--repeat",
      "3",
      "--close",
      "hello there",
    ]);
    expect(first.code).toBe(0);
    expect(first.stdout.trim().split("\n")).toEqual([
      "echo: hello there",
      "echo: hello there",
      "echo: hello there",
    ]);
    expect(first.stderr).toContain(`payer ${payer.address}`);
    expect(first.stderr).toMatch(
      /request 1\/3: 200, voucher opened \(cumulative 1000000\), receipt spent=1000000 acceptedCumulative=1000000/,
    );
    expect(first.stderr).toMatch(/request 2\/3: 200, voucher reused \(cumulative 1000000\)/);
    expect(first.stderr).toMatch(/request 3\/3: 200, voucher reused \(cumulative 1000000\)/);
    expect(first.stderr).toMatch(/closed channel 0x[0-9a-f]{64}: spent 1000000 .* tx 0x[0-9a-f]{64}/);
    for (const output of [first.stdout, first.stderr]) {
      expect(output.toLowerCase()).not.toContain(payerKey.slice(2).toLowerCase());
    }
    expect(devnet.balanceOf(payee.address)).toBe(1n * UNIT + UNIT);

    // A session kept in a state file: two runs share the voucher, a third closes it.
    const stateFile = join(dir, "session.json");
    const a = await cli(["chat", ...common, "--state-file", stateFile, "--repeat", "2", "first"], {});
    expect(a.code).toBe(0);
    const saved = JSON.parse(readFileSync(stateFile, "utf8")) as {
      cumulativeAmount: string;
      signature: string;
    };
    expect(JSON.stringify(saved)).not.toContain(payerKey.slice(2));
    const b = await cli(["chat", ...common, "--state-file", stateFile, "second"]);
    expect(b.code).toBe(0);
    expect(b.stderr).toMatch(/resuming channel/);
    expect(b.stderr).toMatch(/request 1\/1: 200, voucher reused \(cumulative 1000000\)/);
    const c = await cli(["close", "--url", server.baseUrl, "--rpc", devnet.url, "--state-file", stateFile], {
      TOLLGATE_PAYER_KEY: payerKey,
    });
    expect(c.code).toBe(0);
    expect(c.stderr).toMatch(/closed channel 0x[0-9a-f]{64}: spent 1000000/);
    expect(() => readFileSync(stateFile)).toThrow();
    expect(devnet.balanceOf(payee.address)).toBe(1n * UNIT + 2n * UNIT);
    expect(devnet.balanceOf(payer.address)).toBe(100n * UNIT - 2n * UNIT);

    const usage = await cli(["chat", ...common, "--model", "m", "hi"]);
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("--model needs --no-optimize");
  });
});
