import { PaidSession, type PaidSessionEvent } from "@tollgate/agent-client";
import { DEMO_PAYEE_ADDRESS, TEMPO_CHAIN_ID } from "@tollgate/testkit/tempo-devnet";
import { Challenge, Credential } from "mppx";
import { tempo as tempoClient } from "mppx/client";
import { Session } from "mppx/tempo";
import { type Address, type Hex, toHex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BUCKET,
  balanceOf,
  fund,
  PAID_PATH,
  PAID_PROMPT_MARKER,
  type PaidTarget,
  payerClient,
  planDefault,
  quoteFor,
  servedCost,
  type WireEntry,
  wireRecorder,
  wireSecrets,
} from "./paid-door-kit.js";

const { deserializeSessionReceipt } = Session.Precompile.Receipt;
type SessionReceipt = ReturnType<typeof deserializeSessionReceipt>;

/** Funding of each fresh payer: 50 token units. */
const FUNDING = 50_000_000n;

function chatBody(content: string, extra: Record<string, unknown> = {}) {
  return {
    plan: "Starter",
    model_optimization: true,
    max_tokens: 8,
    messages: [{ role: "user", content: `${PAID_PROMPT_MARKER} ${content}` }],
    ...extra,
  };
}

function hasPayment(init: RequestInit | undefined): boolean {
  return /^\s*payment\s/i.test(new Headers(init?.headers).get("authorization") ?? "");
}

/** The `code` of a problem+json answer, asserting it is one. */
async function problemOf(res: Response): Promise<{ code: string; status: number }> {
  expect(res.headers.get("content-type")).toMatch(/^application\/problem\+json/);
  const body = (await res.json()) as { code: string; status: number; error: { code: string } };
  expect(body.error.code).toBe(body.code);
  return body;
}

function randomHex(bytes: number): Hex {
  return toHex(crypto.getRandomValues(new Uint8Array(bytes)));
}

/**
 * The paid door (docs/contract.md, "The paid door") against one running gateway: the unmodified
 * mppx client pays, a tampered body is refused, the close settles exactly; our agent client
 * refreshes its voucher only when asked; every provokable error code of the paid door's table
 * (docs/contract.md, "Errors"); clean logs.
 */
export function describePaidDoor(name: string, setup: () => Promise<PaidTarget>) {
  describe(name, () => {
    let target: PaidTarget;
    /** Every exchange of every scenario, for the log check at the end. */
    const wires: WireEntry[][] = [];
    const payers: Address[] = [];
    const channels: string[] = [];

    beforeAll(async () => {
      target = await setup();
    });

    afterAll(async () => {
      await target?.stop();
    });

    const post = (fetchFn: typeof fetch, body: unknown, headers: Record<string, string> = {}) =>
      fetchFn(`${target.url}${PAID_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });

    it("the unmodified mppx client opens, pays, is refused a tampered body with no model run, and closes to the exact balances", async () => {
      const { url, rpcUrl } = target;
      const key = generatePrivateKey();
      const payer = privateKeyToAccount(key);
      payers.push(payer.address);
      await fund(rpcUrl, payer.address, FUNDING);
      const payerBefore = await balanceOf(rpcUrl, payer.address);
      const payeeBefore = await balanceOf(rpcUrl, DEMO_PAYEE_ADDRESS);
      expect(payerBefore).toBe(FUNDING);

      const wire = wireRecorder();
      wires.push(wire.entries);
      // Tampering: while on, every credentialed retry carries other bytes than the ones its
      // challenge bound (a different one each round, so no fresh challenge ever matches).
      let tamper = false;
      let tampered = 0;
      const clientFetch = (async (input: string | URL | Request, init?: RequestInit) => {
        if (tamper && hasPayment(init) && typeof init?.body === "string" && init.body.length > 0) {
          tampered++;
          const body = JSON.parse(init.body) as ReturnType<typeof chatBody>;
          body.messages[0]!.content += ` [tampered ${tampered}]`;
          return wire.fetch(input, { ...init, body: JSON.stringify(body) });
        }
        return wire.fetch(input, init);
      }) as typeof fetch;
      const manager = tempoClient.session.manager({
        account: payer,
        client: payerClient(rpcUrl, payer),
        maxDeposit: "20",
        fetch: clientFetch,
      });
      const mini = planDefault("Starter");

      // Open, then three vouchers: each a 200 with a receipt the client parsed and accepted.
      const receipts: SessionReceipt[] = [];
      let spent = 0n;
      for (let i = 1; i <= 4; i++) {
        const body = chatBody(`paid request ${i}`);
        const runs = await target.modelRuns();
        const res = await manager.fetch(`${url}${PAID_PATH}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        expect(res.status).toBe(200);
        expect(res.headers.get("payment-receipt")).toBeTruthy();
        expect(res.headers.get("cache-control")).toBe("private");
        expect(res.receipt).not.toBeNull();
        const receipt = res.receipt!;
        const completion = (await res.json()) as {
          object: string;
          model: string;
          choices: Array<{ message: { role: string; content: string } }>;
          usage: { completion_tokens: number };
        };
        expect(completion.object).toBe("chat.completion");
        expect(completion.model).toBe(mini.id);
        expect(completion.choices[0]?.message.role).toBe("assistant");
        expect(completion.choices[0]?.message.content.length).toBeGreaterThan(0);
        expect(completion.usage.completion_tokens).toBe(8);
        // The commit records exactly the served usage at the plan model's price.
        const cost = servedCost(body, mini);
        expect(BigInt(receipt.spent) - spent).toBe(cost);
        expect(res.headers.get("x-tollgate-cost")).toBe(cost.toString());
        spent = BigInt(receipt.spent);
        // mppx signs one more bucket per request: the open carries 1, then 2, 3, 4.
        expect(receipt).toMatchObject({
          method: "tempo",
          intent: "session",
          status: "success",
          channelId: manager.channelId,
          acceptedCumulative: String(BigInt(i) * BUCKET),
          units: i,
        });
        expect(res.cumulative).toBe(BigInt(i) * BUCKET);
        expect(await target.modelRuns()).toBe(runs + 1);
        receipts.push(receipt);
      }
      const channelId = manager.channelId!;
      channels.push(channelId);
      const paid = wire.entries.filter((e) => e.authorization && e.body.length > 0);
      expect(paid.map((e) => e.status)).toEqual([200, 200, 200, 200]);

      // A tampered body: refused with mpp_body_digest_mismatch, and no model runs for it.
      const runsBefore = await target.modelRuns();
      const firstTampered = wire.entries.length;
      tamper = true;
      // The spec's caller action is "Stop": the 402 carries no fresh challenge, so the unmodified
      // client cannot retry and surfaces the refusal to its caller as an error.
      const refusal = await manager
        .fetch(`${url}${PAID_PATH}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(chatBody("paid request 5")),
        })
        .then(
          () => undefined,
          (err: unknown) => err as Error,
        );
      tamper = false;
      expect(refusal?.message).toMatch(/WWW-Authenticate/);
      const tamperedOnWire = wire.entries
        .slice(firstTampered)
        .filter((e) => e.authorization && e.body.includes("[tampered"));
      expect(tampered).toBe(1);
      expect(tamperedOnWire).toHaveLength(tampered);
      for (const e of tamperedOnWire) {
        expect(e.status).toBe(402);
        expect(e.code).toBe("mpp_body_digest_mismatch");
        expect(e.contentType).toMatch(/^application\/problem\+json/);
        // The spec's caller action is "Stop": no fresh challenge, so the client does not retry.
        expect(e.wwwAuthenticate ?? null).toBeNull();
      }
      expect(wire.entries.slice(firstTampered).some((e) => e.status === 200)).toBe(false);
      expect(await target.modelRuns()).toBe(runsBefore);

      // The session goes on after the refusal.
      const after = chatBody("paid request 6");
      const sixth = await manager.fetch(`${url}${PAID_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(after),
      });
      expect(sixth.status).toBe(200);
      await sixth.text();
      expect(BigInt(sixth.receipt!.spent) - spent).toBe(servedCost(after, mini));
      spent = BigInt(sixth.receipt!.spent);
      receipts.push(sixth.receipt!);
      expect(await target.modelRuns()).toBe(runsBefore + 1);

      // Close: the payee gets exactly the committed spend, the payer the rest of its deposits.
      const closed = await manager.close();
      expect(closed).toBeDefined();
      expect(closed!.txHash).toMatch(/^0x[0-9a-f]{64}$/);
      expect(closed!.channelId).toBe(channelId);
      expect(closed!.spent).toBe(receipts.at(-1)!.spent);
      expect(BigInt(closed!.spent)).toBe(spent);
      const payerAfter = await balanceOf(rpcUrl, payer.address);
      const payeeAfter = await balanceOf(rpcUrl, DEMO_PAYEE_ADDRESS);
      expect(payeeAfter - payeeBefore).toBe(spent);
      expect(payerBefore - payerAfter).toBe(spent);
      expect(spent).toBeGreaterThan(0n);
    });

    it("our agent client reuses the cumulative voucher until mpp_voucher_bucket_refresh_required, raises it once and continues", async () => {
      // The unmodified mppx client signs one bucket higher on every request, so it never runs into
      // a refresh; PaidSession reuses its voucher (docs/contract.md, "Payment sessions", rule 4),
      // so it does. A hold is the request's quote inside the accepted cumulative: with a large
      // prompt on Plus (priced per input byte) each quote is ~3/4 of a bucket while the served cost
      // is ~1/4 of it, so the first voucher pays two requests and the third needs a higher one.
      const { url, rpcUrl } = target;
      const pro = planDefault("Plus");
      const filler = "lorem ipsum ".repeat(24_500);
      const bodyOf = (i: number) => chatBody(`${filler} turn ${i}`, { plan: "Plus" });
      const quote = quoteFor(JSON.stringify(bodyOf(1)), pro, 8);
      const cost = servedCost(bodyOf(1), pro);
      expect(quote).toBeLessThanOrEqual(BUCKET - cost);
      expect(quote).toBeGreaterThan(BUCKET - 2n * cost);

      const key = generatePrivateKey();
      const payer = privateKeyToAccount(key);
      payers.push(payer.address);
      await fund(rpcUrl, payer.address, FUNDING);
      const payerBefore = await balanceOf(rpcUrl, payer.address);
      const payeeBefore = await balanceOf(rpcUrl, DEMO_PAYEE_ADDRESS);
      const wire = wireRecorder();
      wires.push(wire.entries);
      const events: PaidSessionEvent[] = [];
      const session = new PaidSession({
        url,
        privateKey: key,
        rpcUrl,
        maxDeposit: 20_000_000n,
        fetch: wire.fetch,
        onEvent: (e) => events.push(e),
      });

      const runs = await target.modelRuns();
      const results = [];
      for (let i = 1; i <= 4; i++) {
        const res = await session.chat(bodyOf(i));
        expect(res.status).toBe(200);
        expect((res.body as { model: string }).model).toBe(pro.id);
        results.push(res);
      }
      channels.push(session.channelId!);
      expect(results.map((r) => r.voucher)).toEqual(["opened", "reused", "raised", "reused"]);
      expect(results.map((r) => r.cumulativeAmount)).toEqual([BUCKET, BUCKET, 2n * BUCKET, 2n * BUCKET]);
      expect(results[2]!.attempts.map((a) => [a.action, a.status, a.code])).toEqual([
        ["reuse", 402, "mpp_voucher_bucket_refresh_required"],
        ["raise", 200, undefined],
      ]);
      expect(events.filter((e) => e.type === "raise")).toEqual([
        { type: "raise", from: BUCKET, to: 2n * BUCKET, reason: "refresh required" },
      ]);
      const refresh = wire.entries.filter((e) => e.code === "mpp_voucher_bucket_refresh_required");
      expect(refresh).toHaveLength(1);
      expect(refresh[0]!.status).toBe(402);
      expect(refresh[0]!.wwwAuthenticate).toMatch(/^Payment /);
      // The refused attempt ran no model (the hold failed before inference): one run per request.
      expect(await target.modelRuns()).toBe(runs + 4);
      for (const [i, r] of results.entries()) {
        expect(BigInt(r.receipt.spent)).toBe(BigInt(i + 1) * cost);
        expect(BigInt(r.receipt.acceptedCumulative)).toBe(r.cumulativeAmount);
      }

      // A voucher above the deposit on this channel: mpp_session_deposit_below_request_cost.
      const state = session.state()!;
      const over = BigInt(state.deposit) + BUCKET;
      const probe = chatBody("deposit probe");
      const unpaid = await post(wire.fetch, probe);
      expect(unpaid.status).toBe(402);
      const challenge = Challenge.fromResponse(unpaid);
      const signature = await Session.Precompile.Voucher.signVoucher(
        payerClient(rpcUrl, payer),
        payer,
        { channelId: state.channelId, cumulativeAmount: over },
        state.escrow,
        state.chainId,
      );
      const credential = Credential.serialize(
        Credential.from({
          challenge,
          payload: {
            action: "voucher",
            channelId: state.channelId,
            descriptor: state.descriptor,
            cumulativeAmount: over.toString(),
            signature,
          },
          source: `did:pkh:eip155:${TEMPO_CHAIN_ID}:${payer.address}`,
        }),
      );
      const below = await post(wire.fetch, probe, { authorization: credential });
      expect(below.status).toBe(402);
      expect((await problemOf(below)).code).toBe("mpp_session_deposit_below_request_cost");
      expect(await target.modelRuns()).toBe(runs + 4);

      // The session still works on its own voucher, then closes to the exact balances.
      const fifth = await session.chat(bodyOf(5));
      expect(fifth.voucher).toBe("reused");
      const closed = await session.close();
      expect(closed).toBeDefined();
      expect(closed!.spent).toBe(5n * cost);
      expect(closed!.cumulativeAmount).toBe(2n * BUCKET);
      expect((await balanceOf(rpcUrl, DEMO_PAYEE_ADDRESS)) - payeeBefore).toBe(5n * cost);
      expect(payerBefore - (await balanceOf(rpcUrl, payer.address))).toBe(5n * cost);
    });

    describe("error codes through the real gateway", () => {
      const wire = wireRecorder();
      wires.push(wire.entries);
      const body = chatBody("error probe");

      /** A real challenge for `body`, as the unpaid request gets it. */
      async function challengeFor(b: unknown) {
        const res = await post(wire.fetch, b);
        expect(res.status).toBe(402);
        await res.body?.cancel();
        return Challenge.fromResponse(res);
      }

      /** A well-formed voucher payload on a made-up channel. */
      function voucherPayload() {
        const payer = privateKeyToAccount(generatePrivateKey()).address;
        return {
          source: `did:pkh:eip155:${TEMPO_CHAIN_ID}:${payer}`,
          payload: {
            action: "voucher",
            channelId: randomHex(32),
            descriptor: {
              payer,
              payee: DEMO_PAYEE_ADDRESS,
              operator: "0x0000000000000000000000000000000000000000",
              token: "0x20C000000000000000000000b9537d11c60E8b50",
              salt: randomHex(32),
              authorizedSigner: payer,
              expiringNonceHash: randomHex(32),
            },
            cumulativeAmount: BUCKET.toString(),
            signature: randomHex(65),
          },
        };
      }

      async function expectRefusal(res: Response, status: number, code: string, runsBefore: number) {
        expect({ status: res.status, code: (await problemOf(res)).code }).toEqual({ status, code });
        if (status === 402) expect(res.headers.get("www-authenticate")).toMatch(/^Payment /);
        // Refused before inference: no model ran.
        expect(await target.modelRuns()).toBe(runsBefore);
      }

      it("payment_required: an unpaid request gets 402 and a Payment challenge", async () => {
        const runs = await target.modelRuns();
        const res = await post(wire.fetch, body);
        expect(res.headers.get("cache-control")).toBe("no-store");
        const challenge = Challenge.fromResponse(res);
        expect(challenge).toMatchObject({ method: "tempo", intent: "session" });
        expect(challenge.request).toMatchObject({
          amount: BUCKET.toString(),
          suggestedDeposit: "5000000",
          methodDetails: { chainId: TEMPO_CHAIN_ID, sessionProtocol: "v2" },
        });
        await expectRefusal(res, 402, "payment_required", runs);
      });

      it.each([
        ["not base64url", "Payment !!!notbase64"],
        ["base64url JSON without challenge and payload", "Payment e30"],
        ["missing after the scheme", "Payment"],
        ["too large (over 8 KiB)", `Payment ${"A".repeat(9_000)}`],
      ])("mpp_malformed_credential: a Payment credential %s", async (_label, authorization) => {
        const runs = await target.modelRuns();
        const res = await post(wire.fetch, body, { authorization });
        await expectRefusal(res, 402, "mpp_malformed_credential", runs);
      });

      it("mpp_invalid_challenge: an echoed challenge that was tampered with, or pushed past its expiry", async () => {
        const runs = await target.modelRuns();
        const challenge = await challengeFor(body);
        const { payload, source } = voucherPayload();
        // A challenge that expired honestly needs the 300 s TTL to pass (neither the all-in-one nor
        // startStack lets a test shorten MPP_CHALLENGE_TTL_SECONDS); an expiry moved into the past
        // is caught by the HMAC, as every other edit of the echoed challenge is.
        const variants = [
          // a longer life than the service granted
          { ...challenge, expires: new Date(Date.now() + 3_600_000).toISOString() },
          // already expired
          { ...challenge, expires: new Date(Date.now() - 1_000).toISOString() },
          // another recipient
          { ...challenge, request: { ...challenge.request, recipient: payload.descriptor.payer } },
          // not issued by this service at all
          { ...challenge, id: randomHex(32).slice(2) },
        ];
        for (const c of variants) {
          const credential = Credential.serialize(Credential.from({ challenge: c, payload, source }));
          const res = await post(wire.fetch, body, { authorization: credential });
          await expectRefusal(res, 402, "mpp_invalid_challenge", runs);
        }
      });

      it("mpp_method_unsupported: a correctly encoded credential for another method or intent", async () => {
        const runs = await target.modelRuns();
        const challenge = await challengeFor(body);
        const { payload, source } = voucherPayload();
        for (const c of [
          { ...challenge, intent: "charge" },
          { ...challenge, method: "stripe" },
        ]) {
          const credential = Credential.serialize(Credential.from({ challenge: c, payload, source }));
          const res = await post(wire.fetch, body, { authorization: credential });
          await expectRefusal(res, 400, "mpp_method_unsupported", runs);
        }
      });

      it("mpp_payment_verification_failed: our own challenge with a voucher for a channel that does not exist", async () => {
        const runs = await target.modelRuns();
        const challenge = await challengeFor(body);
        const { payload, source } = voucherPayload();
        const credential = Credential.serialize(Credential.from({ challenge, payload, source }));
        const res = await post(wire.fetch, body, { authorization: credential });
        await expectRefusal(res, 402, "mpp_payment_verification_failed", runs);
      });

      it("mpp_streaming_unavailable: stream: true", async () => {
        const runs = await target.modelRuns();
        const res = await post(wire.fetch, { ...body, stream: true });
        await expectRefusal(res, 400, "mpp_streaming_unavailable", runs);
      });

      it("mpp_request_exceeds_voucher_bucket: a request whose quote is above the bucket, on the unpaid request", async () => {
        // max_tokens alone cannot do it on the demo config: the priciest output (tollgate-pro,
        // 10 per token) at its 8192-token maximum quotes 81920 < 1000000. The input bound can.
        const runs = await target.modelRuns();
        const big = chatBody("lorem ipsum ".repeat(40_000), { plan: "Plus", max_tokens: 8192 });
        expect(quoteFor(JSON.stringify(big), planDefault("Plus"), 8192)).toBeGreaterThan(BUCKET);
        const res = await post(wire.fetch, big);
        await expectRefusal(res, 400, "mpp_request_exceeds_voucher_bucket", runs);
      });

      it("a Bearer key on the paid route is a 401", async () => {
        const runs = await target.modelRuns();
        const res = await post(wire.fetch, body, {
          authorization: "Bearer tg_demo_4f9c2d7e1b8a6053c9e2f1a7d4b8c6e0",
        });
        await expectRefusal(res, 401, "wrong_auth_scheme", runs);
      });

      it("HEAD on the paid route is a 405 and never runs a model", async () => {
        const runs = await target.modelRuns();
        const res = await wire.fetch(`${target.url}${PAID_PATH}`, { method: "HEAD" });
        expect(res.status).toBe(405);
        expect(res.headers.get("allow")).toBe("POST");
        expect(await target.modelRuns()).toBe(runs);
      });

      it("a Payment credential on /v1/chat/completions is a 401", async () => {
        const runs = await target.modelRuns();
        const challenge = await challengeFor(body);
        const { payload, source } = voucherPayload();
        const credential = Credential.serialize(Credential.from({ challenge, payload, source }));
        const res = await wire.fetch(`${target.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: credential },
          body: JSON.stringify({ model: "tollgate-mini", max_tokens: 4, messages: body.messages }),
        });
        expect(res.status).toBe(401);
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe("wrong_auth_scheme");
        expect(await target.modelRuns()).toBe(runs);
      });
    });

    it("logs of the whole run hold no credential, signature, wallet address, receipt, channel id or prompt text", async () => {
      await new Promise((r) => setTimeout(r, 300));
      const logs = target.logs();
      expect(logs).toContain("request served");
      const lower = logs.toLowerCase();
      const entries = wires.flat();
      expect(entries.some((e) => e.receipt)).toBe(true);
      const secrets = wireSecrets(entries);
      expect(secrets.length).toBeGreaterThan(10);
      for (const s of secrets)
        expect(lower.includes(s.toLowerCase()), `a wire secret is in the logs`).toBe(false);
      expect(logs).not.toMatch(/payment\s+[A-Za-z0-9_-]{16,}/i);
      expect(logs).not.toMatch(/0x[0-9a-fA-F]{130}/);
      for (const a of [...payers, DEMO_PAYEE_ADDRESS]) expect(lower).not.toContain(a.slice(2).toLowerCase());
      for (const c of channels) expect(lower).not.toContain(c.slice(2).toLowerCase());
      expect(logs).not.toContain(PAID_PROMPT_MARKER);
      expect(logs).not.toContain("marigold");
      expect(logs).not.toContain("lorem ipsum");
      // metering committed every paid hold from its usage event too (after api-edge's Commit, a
      // repeat): none was refused, and no event waits for a Commit metering may not send.
      expect(logs).not.toContain("paid hold not committed from its usage event");
      expect(logs).not.toContain("usage events not applied");
    });
  });
}
