import { createHash } from "node:crypto";
import { inputBoundOf } from "@tollgate/config";
import { createLogger } from "@tollgate/kit/log";
import { Challenge, Credential, PaymentRequest } from "mppx";
import { Session } from "mppx/tempo";
import { type Hex, parseSignature, serializeSignature } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { describe, expect, it } from "vitest";
import {
  CHAIN_ID,
  ESCROW,
  FakeChain,
  PATH,
  paidRequest,
  signVoucher,
  TestPayer,
  testGateway,
  testSettings,
  UNIT,
  USDC_E,
} from "../../test/support.js";
import { createMemoryChannelStore } from "../adapters/memory-channel-store.js";
import { createCatalog } from "./catalog.js";
import { idOverEcho } from "./challenge.js";
import { PaymentError, type PaymentErrorCode } from "./errors.js";
import { createPayments, type Payments } from "./payments.js";
import type { ChannelStore } from "./ports.js";
import type { PaymentSettings } from "./settings.js";

const PAYEE = privateKeyToAccount(generatePrivateKey()).address;
const T0 = Date.parse("2026-10-01T12:00:00Z");
const { deserializeSessionReceipt } = Session.Precompile.Receipt;

interface Setup {
  payments: Payments;
  chain: FakeChain;
  store: ChannelStore;
  settings: PaymentSettings;
  lines: string[];
  advance(ms: number): void;
}

function setup(
  opts: {
    settings?: Partial<PaymentSettings>;
    store?: ChannelStore;
    chain?: FakeChain;
    free?: boolean;
    closeWaitMs?: number;
    onOverHold?: (over: { actual: bigint; charged: bigint }) => void;
  } = {},
): Setup {
  let clock = T0;
  const lines: string[] = [];
  const log = createLogger({
    service: "mpp-payment",
    level: "debug",
    destination: { write: (l: string) => void lines.push(l) },
  });
  const chain = opts.chain ?? new FakeChain();
  const store = opts.store ?? createMemoryChannelStore({ now: () => clock });
  const settings = testSettings(PAYEE, opts.settings);
  const payments = createPayments({
    settings,
    catalog: createCatalog(testGateway({ free: opts.free ?? false })),
    store,
    chain,
    log,
    now: () => clock,
    ...(opts.closeWaitMs === undefined ? {} : { closeWaitMs: opts.closeWaitMs }),
    ...(opts.onOverHold ? { onOverHold: opts.onOverHold } : {}),
  });
  const advance = (ms: number) => {
    clock += ms;
  };
  return { payments, chain, store, settings, lines, advance };
}

async function rejects(p: Promise<unknown> | (() => unknown), code: PaymentErrorCode): Promise<PaymentError> {
  let err: unknown;
  try {
    await (typeof p === "function" ? p() : p);
  } catch (e) {
    err = e;
  }
  expect(err, `expected ${code}`).toBeInstanceOf(PaymentError);
  expect((err as PaymentError).code).toBe(code);
  return err as PaymentError;
}

/** An unpaid request answered with its challenge, and a payer whose channel opened with `cumulative`. */
async function opened(s: Setup, cumulative = UNIT) {
  const req = paidRequest();
  const issued = s.payments.challenge(req);
  const payer = new TestPayer(PAYEE);
  const verified = await s.payments.verify({
    authorization: payer.credential(issued.header, await payer.open(cumulative)),
    httpMethod: "POST",
    path: PATH,
    body: req.body,
  });
  return { req, issued, payer, verified, channelId: payer.channelId };
}

describe("Challenge", () => {
  it("binds route, plan, model, runtime, pricing, caps, digest and expiry, HMAC-protected", () => {
    const s = setup();
    const req = paidRequest({ plan: "Plus", modelOptimization: false, model: "big", outputCap: 100 });
    const issued = s.payments.challenge(req);
    const ch = Challenge.deserialize(issued.header);
    expect(ch).toMatchObject({ id: issued.id, realm: "tollgate-test", method: "tempo", intent: "session" });
    expect(ch.request).toEqual({
      amount: "1000000",
      currency: USDC_E,
      recipient: PAYEE,
      suggestedDeposit: "5000000",
      unitType: "request",
      methodDetails: { chainId: CHAIN_ID, escrowContract: ESCROW, sessionProtocol: "v2" },
    });
    // The request parameter is JCS-canonical, so a faithful echo re-serializes to the same bytes.
    const requestParam = /request="([^"]+)"/.exec(issued.header)?.[1];
    expect(requestParam).toBe(PaymentRequest.serialize(ch.request));
    expect(ch.digest).toBe(`sha-256=${createHash("sha256").update(req.body).digest("base64")}`);
    expect(Date.parse(ch.expires!)).toBe(T0 + 300_000);
    expect(Challenge.verify(ch, { secretKey: s.settings.secret })).toBe(true);
    expect(Challenge.verify(ch, { secretKey: "another-secret-0123456789abcdef0123456789" })).toBe(false);
    const inputCap = inputBoundOf(req.body.byteLength, 1);
    expect(issued.binding).toEqual({
      httpMethod: "POST",
      path: PATH,
      plan: "Plus",
      model: "big",
      runtime: "ollama",
      pricingSnapshotId: expect.stringMatching(/^ps_[0-9a-f]{16}$/),
      inputCap,
      outputCap: 100,
    });
    // 200 base units per input token, 600 per output token.
    expect(issued.quote).toBe(BigInt(inputCap) * 200n + 100n * 600n);
  });

  it("round-trips: Verify recovers the binding and the quote from the echoed challenge", async () => {
    const s = setup();
    const { issued, verified, channelId } = await opened(s);
    expect(verified).toEqual({
      action: "open",
      channelId,
      challengeId: issued.id,
      binding: issued.binding,
      acceptedCumulative: UNIT,
      quote: issued.quote,
      acceptedReceipt: expect.any(String),
    });
    // The accepted open's own receipt, nothing charged: what a failed answer carries.
    expect(deserializeSessionReceipt(verified.acceptedReceipt!)).toEqual({
      method: "tempo",
      intent: "session",
      status: "success",
      timestamp: new Date(T0).toISOString(),
      reference: channelId,
      challengeId: issued.id,
      channelId,
      acceptedCumulative: "1000000",
      spent: "0",
      units: 0,
    });
  });

  it("picks the plan's default model with model_optimization and the given one without", () => {
    const s = setup();
    expect(s.payments.challenge(paidRequest({ plan: "Premium" })).binding.model).toBe("big");
    expect(
      s.payments.challenge(paidRequest({ plan: "Plus", modelOptimization: false, model: "small" })).binding
        .model,
    ).toBe("small");
  });

  it("refuses plan and model problems as mpp_invalid_request", async () => {
    const s = setup();
    for (const bad of [
      paidRequest({ plan: "Gold" }),
      paidRequest({ plan: "Starter", modelOptimization: false, model: "big" }),
      paidRequest({ plan: "Starter", modelOptimization: false, model: "" }),
      paidRequest({ plan: "Starter", modelOptimization: true, model: "small" }),
      paidRequest({ outputCap: 0 }),
      paidRequest({ outputCap: 5000 }),
      paidRequest({ messageCount: 0 }),
    ]) {
      await rejects(() => s.payments.challenge(bad), "mpp_invalid_request");
    }
  });

  it("refuses a request without a positive quote, and one that can never fit the bucket", async () => {
    await rejects(() => setup({ free: true }).payments.challenge(paidRequest()), "mpp_request_quote_invalid");
    await rejects(
      () => setup({ settings: { bucket: 100n } }).payments.challenge(paidRequest()),
      "mpp_request_exceeds_voucher_bucket",
    );
  });
});

describe("Verify", () => {
  it("opens a channel: validates the transaction, then broadcasts it and records the voucher", async () => {
    const s = setup();
    const { channelId } = await opened(s);
    expect(s.chain.calls.filter((c) => c === "checkOpen" || c === "submitOpen")).toEqual([
      "checkOpen",
      "submitOpen",
    ]);
    expect(await s.store.get(channelId)).toMatchObject({
      deposit: 5n * UNIT,
      highest: { cumulative: UNIT },
      status: "open",
    });
  });

  it("accepts an equal voucher again, a higher one, and refuses a lower one", async () => {
    const s = setup();
    const { req, issued, payer } = await opened(s, 2n * UNIT);
    const verify = async (cumulative: bigint) =>
      s.payments.verify({
        authorization: payer.credential(issued.header, await payer.voucher(cumulative)),
        httpMethod: "POST",
        path: PATH,
        body: req.body,
      });
    expect((await verify(2n * UNIT)).acceptedCumulative).toBe(2n * UNIT);
    expect((await verify(2n * UNIT)).acceptedCumulative).toBe(2n * UNIT);
    // The reused voucher skips re-verification only when byte-identical: the same amount signed
    // by someone else is still refused.
    const forged = {
      ...(await payer.voucher(2n * UNIT)),
      signature: await signVoucher(new TestPayer(PAYEE).account, payer.channelId, 2n * UNIT),
    };
    await rejects(
      s.payments.verify({
        authorization: payer.credential(issued.header, forged),
        httpMethod: "POST",
        path: PATH,
        body: req.body,
      }),
      "mpp_payment_verification_failed",
    );
    expect((await verify(3n * UNIT)).acceptedCumulative).toBe(3n * UNIT);
    await rejects(verify(2n * UNIT), "mpp_payment_verification_failed");
    // The open credential replayed is its voucher again: below the highest now.
    await rejects(
      s.payments.verify({
        authorization: payer.credential(issued.header, await payer.open(2n * UNIT)),
        httpMethod: "POST",
        path: PATH,
        body: req.body,
      }),
      "mpp_payment_verification_failed",
    );
    expect(s.chain.calls.filter((c) => c === "submitOpen")).toHaveLength(1);
  });

  describe("refuses every credential problem with the spec's code", () => {
    async function challenged(s: Setup) {
      const req = paidRequest();
      return { req, issued: s.payments.challenge(req), payer: new TestPayer(PAYEE) };
    }
    const verifyWith = (s: Setup, authorization: string, body: Uint8Array, path = PATH) =>
      s.payments.verify({ authorization, httpMethod: "POST", path, body });

    it("mpp_malformed_credential", async () => {
      const s = setup({ settings: { maxCredentialBytes: 4096 } });
      const { req } = await challenged(s);
      const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
      for (const authorization of [
        "",
        "Bearer abc",
        "Payment",
        `Payment ${"a".repeat(5000)}`,
        "Payment not*base64url!",
        `Payment ${Buffer.from("not json").toString("base64url")}`,
        `Payment ${b64({ payload: {} })}`,
        `Payment ${b64({ challenge: {}, payload: "x" })}`,
      ]) {
        await rejects(verifyWith(s, authorization, req.body), "mpp_malformed_credential");
      }
    });

    it("mpp_method_unsupported", async () => {
      const s = setup();
      const { req, issued, payer } = await challenged(s);
      const ch = Challenge.deserialize(issued.header);
      const charge = Credential.serialize({
        challenge: { ...ch, method: "stripe" },
        payload: await payer.open(UNIT),
        source: payer.source,
      });
      await rejects(verifyWith(s, charge, req.body), "mpp_method_unsupported");
      const notSession = payer.credential(issued.header, { action: "charge", signature: "0x00" });
      await rejects(verifyWith(s, notSession, req.body), "mpp_method_unsupported");
    });

    it("mpp_invalid_challenge", async () => {
      const s = setup();
      const { req, issued, payer } = await challenged(s);
      const payload = await payer.open(UNIT);
      const ch = Challenge.deserialize(issued.header);
      const forged = Challenge.from({
        secretKey: "not-our-secret-0123456789abcdef0123456789",
        realm: ch.realm,
        method: ch.method,
        intent: ch.intent,
        request: ch.request,
        digest: ch.digest!,
        expires: ch.expires!,
        opaque: ch.opaque!,
      });
      const tampered = { ...ch, request: { ...ch.request, amount: "1" } };
      const noExpiry: Record<string, unknown> = { ...ch };
      delete noExpiry["expires"];
      for (const challenge of [forged, tampered, noExpiry]) {
        const auth = Credential.serialize({
          challenge: challenge as typeof ch,
          payload,
          source: payer.source,
        });
        await rejects(verifyWith(s, auth, req.body), "mpp_invalid_challenge");
      }
      const auth = payer.credential(issued.header, payload);
      await rejects(verifyWith(s, auth, req.body, "/v1/other"), "mpp_invalid_challenge");
      // The same secret but another bucket: the echoed amount no longer matches the config.
      const rebucketed = setup({ settings: { bucket: 2n * UNIT } });
      await rejects(verifyWith(rebucketed, auth, req.body), "mpp_invalid_challenge");
      s.advance(300_000);
      await rejects(verifyWith(s, auth, req.body), "mpp_invalid_challenge");
      expect(s.chain.calls).toEqual([]);
    });

    it("reads the challenge mppx echoes as sent, and refuses any other spelling of it", async () => {
      const s = setup();
      const { req, issued, payer } = await challenged(s);
      const payload = await payer.open(UNIT);
      const auth = payer.credential(issued.header, payload);
      const wire = JSON.parse(Buffer.from(auth.replace(/^Payment /, ""), "base64url").toString("utf8"));
      const echoed = wire.challenge as Record<string, unknown>;
      // The echo of an unmodified client is checked over its own texts: no decoding, no mppx.
      expect(idOverEcho(echoed, s.settings.secret)).toBe(true);
      expect(idOverEcho(echoed, "another-secret-0123456789abcdef0123456789")).toBe(false);
      const spelled = (change: Record<string, unknown>) => {
        const challenge = { ...echoed, ...change };
        expect(idOverEcho(challenge, s.settings.secret)).toBe(false);
        return `Payment ${Buffer.from(JSON.stringify({ ...wire, challenge })).toString("base64url")}`;
      };
      // The same id spelled otherwise (padded), or with any field changed: refused, so one issued
      // challenge has one id, the key of its single use.
      for (const change of [
        { id: `${echoed["id"]}=` },
        { realm: "elsewhere" },
        { expires: new Date(T0 + 600_000).toISOString() },
        { digest: `sha-256=${createHash("sha256").update("other").digest("base64")}` },
        { opaque: Buffer.from(JSON.stringify({ v: "1" })).toString("base64url") },
        {
          request: PaymentRequest.serialize({
            ...PaymentRequest.deserialize(echoed["request"] as string),
            amount: "1",
          }),
        },
      ]) {
        await rejects(verifyWith(s, spelled(change), req.body), "mpp_invalid_challenge");
      }
      await rejects(verifyWith(s, spelled({ method: "stripe" }), req.body), "mpp_method_unsupported");
      expect(s.chain.calls).toEqual([]);
      // The same terms in another key order: not this service's text, so mppx reads it (decoding
      // and re-encoding it canonically), and the challenge still holds.
      const terms = PaymentRequest.deserialize(echoed["request"] as string);
      const reordered = Buffer.from(
        JSON.stringify(Object.fromEntries(Object.entries(terms).reverse())),
      ).toString("base64url");
      const verified = await verifyWith(s, spelled({ request: reordered }), req.body);
      expect(verified).toMatchObject({ action: "open", challengeId: issued.id, quote: issued.quote });
    });

    it("accepts an older client's expanded opaque through mppx's reading", async () => {
      const s = setup();
      const { req, issued, payer } = await challenged(s);
      const auth = payer.credential(issued.header, await payer.open(UNIT));
      const wire = JSON.parse(Buffer.from(auth.replace(/^Payment /, ""), "base64url").toString("utf8"));
      const opaque = PaymentRequest.deserialize(wire.challenge.opaque);
      const legacy = { ...wire, challenge: { ...wire.challenge, opaque } };
      expect(idOverEcho(legacy.challenge, s.settings.secret)).toBe(false);
      const verified = await verifyWith(
        s,
        `Payment ${Buffer.from(JSON.stringify(legacy)).toString("base64url")}`,
        req.body,
      );
      expect(verified).toMatchObject({ action: "open", challengeId: issued.id, quote: issued.quote });
    });

    it("mpp_body_digest_mismatch", async () => {
      const s = setup();
      const { issued, payer } = await challenged(s);
      const auth = payer.credential(issued.header, await payer.open(UNIT));
      await rejects(
        verifyWith(s, auth, paidRequest({ content: "Say hellO." }).body),
        "mpp_body_digest_mismatch",
      );
      expect(s.chain.calls).toEqual([]);
    });

    it("mpp_payment_verification_failed", async () => {
      const s = setup();
      const { req, issued, payer } = await challenged(s);
      const stranger = new TestPayer(PAYEE);
      const cases: Array<[string, Record<string, unknown>, string | null]> = [
        [
          "signed by someone else",
          {
            ...(await payer.open(UNIT)),
            signature: await signVoucher(stranger.account, payer.channelId, UNIT),
          },
          payer.source,
        ],
        [
          "descriptor not hashing to the channel id",
          { ...(await payer.open(UNIT)), descriptor: stranger.descriptor },
          payer.source,
        ],
        ["payee is not this service", await new TestPayer(stranger.account.address).open(UNIT), null],
        ["no source", await payer.open(UNIT), null],
        ["a stranger's source", await payer.open(UNIT), stranger.source],
        ["a payload field is invalid", { ...(await payer.open(UNIT)), cumulativeAmount: "-1" }, payer.source],
        ["no descriptor", { ...(await payer.open(UNIT)), descriptor: undefined }, payer.source],
      ];
      for (const [why, payload, source] of cases) {
        const err = await rejects(
          verifyWith(s, payer.credential(issued.header, payload, source), req.body),
          "mpp_payment_verification_failed",
        );
        expect(err.message, why).not.toMatch(/0x[0-9a-f]{40}/i);
      }
      // A high-s twin of a valid signature (same signer, malleated) is refused too.
      const good = await signVoucher(payer.account, payer.channelId, UNIT);
      const { r, s: sv, yParity } = parseSignature(good);
      const n = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
      const highS = serializeSignature({
        r,
        s: `0x${(n - BigInt(sv)).toString(16).padStart(64, "0")}` as Hex,
        yParity: yParity === 0 ? 1 : 0,
      });
      await rejects(
        verifyWith(
          s,
          payer.credential(issued.header, { ...(await payer.open(UNIT)), signature: highS }),
          req.body,
        ),
        "mpp_payment_verification_failed",
      );
      expect(s.chain.calls).toEqual([]);

      // The open transaction does not match: refused before anything is broadcast.
      s.chain.rejectChecks = true;
      const auth = payer.credential(issued.header, await payer.open(UNIT));
      await rejects(verifyWith(s, auth, req.body), "mpp_payment_verification_failed");
      expect(s.chain.calls).toEqual(["checkOpen"]);
      // The broadcast fails: nothing is recorded.
      s.chain.rejectChecks = false;
      s.chain.failSubmit = true;
      await rejects(verifyWith(s, auth, req.body), "mpp_payment_verification_failed");
      expect(await s.store.get(payer.channelId)).toBeUndefined();
    });

    it("mpp_payment_verification_failed for a known descriptor under another channel id", async () => {
      // The payer's descriptor was hashed (and remembered) when it opened; named with the id of
      // another channel, it is still refused, whichever of the two ids is known.
      const s = setup();
      const { req, payer } = await opened(s);
      const stranger = new TestPayer(PAYEE);
      const cases: Array<[Record<string, unknown>, string]> = [
        [{ ...(await stranger.voucher(UNIT)), descriptor: payer.descriptor }, payer.source],
        // The stranger's own descriptor and signature, on the payer's (known) channel: were the
        // id taken as known from the channel id alone, the stranger would spend the payer's channel.
        [
          {
            ...(await stranger.voucher(2n * UNIT)),
            channelId: payer.channelId,
            signature: await signVoucher(stranger.account, payer.channelId, 2n * UNIT),
          },
          stranger.source,
        ],
      ];
      for (const [payload, source] of cases) {
        const issued = s.payments.challenge(req);
        await rejects(
          verifyWith(s, payer.credential(issued.header, payload, source), req.body),
          "mpp_payment_verification_failed",
        );
      }
      // Its own channel's new voucher still passes.
      const issued = s.payments.challenge(req);
      const ok = await verifyWith(
        s,
        payer.credential(issued.header, await payer.voucher(2n * UNIT)),
        req.body,
      );
      expect(ok.channelId).toBe(payer.channelId);
    });

    it("mpp_payment_verification_failed for vouchers at or below what is settled, or with a close pending", async () => {
      const s = setup();
      const { req, issued, payer, channelId } = await opened(s);
      const verify = async (cumulative: bigint) =>
        verifyWith(s, payer.credential(issued.header, await payer.voucher(cumulative)), req.body);
      s.advance(10_000);
      s.chain.states.set(channelId, { deposit: 5n * UNIT, settled: 2n * UNIT, closeRequestedAt: 0 });
      await rejects(verify(2n * UNIT), "mpp_payment_verification_failed");
      s.advance(10_000);
      s.chain.states.set(channelId, { deposit: 5n * UNIT, settled: 0n, closeRequestedAt: 1_700_000_000 });
      await rejects(verify(2n * UNIT), "mpp_payment_verification_failed");
    });

    it("mpp_payer_not_allowed", async () => {
      const s = setup({ settings: { payerAllowlist: [PAYEE] } });
      const { req, issued, payer } = await challenged(s);
      await rejects(
        verifyWith(s, payer.credential(issued.header, await payer.open(UNIT)), req.body),
        "mpp_payer_not_allowed",
      );
      expect(s.chain.calls).toEqual([]);
      const allowed = setup({ settings: { payerAllowlist: [payer.account.address.toLowerCase() as Hex] } });
      const again = allowed.payments.challenge(req);
      const v = await verifyWith(allowed, payer.credential(again.header, await payer.open(UNIT)), req.body);
      expect(v.acceptedCumulative).toBe(UNIT);
    });

    it("mpp_session_deposit_below_request_cost", async () => {
      const s = setup();
      s.chain.openDeposit = UNIT / 2n;
      const { req, issued, payer } = await challenged(s);
      await rejects(
        verifyWith(s, payer.credential(issued.header, await payer.open(UNIT)), req.body),
        "mpp_session_deposit_below_request_cost",
      );
      expect(s.chain.calls).toEqual(["checkOpen"]);
      s.chain.openDeposit = 5n * UNIT;
      await verifyWith(s, payer.credential(issued.header, await payer.open(UNIT)), req.body);
      await rejects(
        verifyWith(s, payer.credential(issued.header, await payer.voucher(6n * UNIT)), req.body),
        "mpp_session_deposit_below_request_cost",
      );
    });
  });

  it("tops up a bodyless management request and answers with a receipt", async () => {
    const s = setup();
    const { issued, payer, channelId } = await opened(s);
    const v = await s.payments.verify({
      authorization: payer.credential(issued.header, payer.topUp(3n * UNIT)),
      httpMethod: "POST",
      path: PATH,
      body: new Uint8Array(),
    });
    expect(v).toMatchObject({ action: "topUp", channelId, acceptedCumulative: UNIT });
    const receipt = deserializeSessionReceipt(v.paymentReceipt!);
    expect(receipt).toMatchObject({
      challengeId: issued.id,
      channelId,
      acceptedCumulative: "1000000",
      spent: "0",
    });
    expect(receipt.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect((await s.store.get(channelId))?.deposit).toBe(8n * UNIT);
    // A voucher up to the new deposit is now accepted.
    const v8 = await s.payments.verify({
      authorization: payer.credential(issued.header, await payer.voucher(8n * UNIT)),
      httpMethod: "POST",
      path: PATH,
      body: paidRequest().body,
    });
    expect(v8.acceptedCumulative).toBe(8n * UNIT);
  });

  it("adopts a live channel it does not know from the chain", async () => {
    const s = setup();
    const req = paidRequest();
    const issued = s.payments.challenge(req);
    const payer = new TestPayer(PAYEE);
    s.chain.states.set(payer.channelId, { deposit: 5n * UNIT, settled: UNIT, closeRequestedAt: 0 });
    const v = await s.payments.verify({
      authorization: payer.credential(issued.header, await payer.voucher(2n * UNIT)),
      httpMethod: "POST",
      path: PATH,
      body: req.body,
    });
    expect(v.acceptedCumulative).toBe(2n * UNIT);
    expect(await s.store.get(payer.channelId)).toMatchObject({
      settled: UNIT,
      spent: 0n,
      deposit: 5n * UNIT,
    });
  });
});

/** The store, recording the name of every operation called on it. */
function recorded(store: ChannelStore): { store: ChannelStore; calls: string[] } {
  const calls: string[] = [];
  const proxy = new Proxy(store, {
    get(target, key) {
      const value = Reflect.get(target, key) as unknown;
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        calls.push(String(key));
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { store: proxy, calls };
}

describe("Verify with the request's hold (one round trip)", () => {
  async function session(cumulative = 2n * UNIT) {
    const { store, calls } = recorded(createMemoryChannelStore({ now: () => T0 }));
    const s = setup({ store });
    const o = await opened(s, cumulative);
    const pay = async (voucherCumulative: bigint, requestId: string) => {
      const req = paidRequest();
      const issued = s.payments.challenge(req);
      calls.length = 0;
      const result = await s.payments.verifyAndReserve(
        {
          authorization: o.payer.credential(issued.header, await o.payer.voucher(voucherCumulative)),
          httpMethod: "POST",
          path: PATH,
          body: req.body,
        },
        requestId,
      );
      return { ...result, issued, calls: [...calls] };
    };
    return { s, ...o, pay };
  }

  it("checks a reused voucher and holds the quote in one store step, answering the hold's receipt", async () => {
    const { s, channelId, pay } = await session();
    const first = await pay(2n * UNIT, "req_1");
    expect(first.calls).toEqual(["offerVoucher"]);
    expect(first.verified).toMatchObject({ action: "voucher", channelId, acceptedCumulative: 2n * UNIT });
    expect(deserializeSessionReceipt(first.held!.receipt)).toMatchObject({
      challengeId: first.issued.id,
      channelId,
      acceptedCumulative: String(2n * UNIT),
      spent: "0",
      units: 0,
    });
    expect(first.verified.acceptedReceipt).toBe(first.held!.receipt);
    expect((await s.store.get(channelId))?.held).toBe(first.issued.quote);
    await s.payments.commit(first.held!.reservationId, channelId, first.issued.id, "1234");
    const second = await pay(2n * UNIT, "req_2");
    expect(second.calls).toEqual(["offerVoucher"]);
    expect(second.held!.reservationId).not.toBe(first.held!.reservationId);
    expect(deserializeSessionReceipt(second.held!.receipt)).toMatchObject({ spent: "1234", units: 1 });
  });

  it("accepts a new voucher and holds the quote in one store step too, as the mppx client pays; a forged one is refused", async () => {
    const { s, channelId, payer, pay } = await session();
    const higher = await pay(3n * UNIT, "req_1");
    expect(higher.calls).toEqual(["offerVoucher"]);
    expect(higher.verified.acceptedCumulative).toBe(3n * UNIT);
    expect(deserializeSessionReceipt(higher.held!.receipt)).toMatchObject({
      challengeId: higher.issued.id,
      acceptedCumulative: String(3n * UNIT),
      spent: "0",
      units: 0,
    });
    expect(higher.verified.acceptedReceipt).toBe(higher.held!.receipt);
    expect((await s.store.get(channelId))?.held).toBe(higher.issued.quote);
    await s.payments.commit(higher.held!.reservationId, channelId, higher.issued.id, "1234");
    // The next request's voucher, one bucket higher (mppx's session manager signs one per request).
    const next = await pay(4n * UNIT, "req_4");
    expect(next.calls).toEqual(["offerVoucher"]);
    expect(deserializeSessionReceipt(next.held!.receipt)).toMatchObject({
      acceptedCumulative: String(4n * UNIT),
      spent: "1234",
      units: 1,
    });
    await s.payments.release(next.held!.reservationId, channelId);
    // The accepted amount signed by someone else is not the accepted voucher: refused, nothing held.
    const req = paidRequest();
    const issued = s.payments.challenge(req);
    const forged = {
      ...(await payer.voucher(3n * UNIT)),
      signature: await signVoucher(new TestPayer(PAYEE).account, channelId, 3n * UNIT),
    };
    await rejects(
      s.payments.verifyAndReserve(
        {
          authorization: payer.credential(issued.header, forged),
          httpMethod: "POST",
          path: PATH,
          body: req.body,
        },
        "req_2",
      ),
      "mpp_payment_verification_failed",
    );
    // A stale voucher (the one reused before) is refused too.
    await rejects(pay(2n * UNIT, "req_3"), "mpp_payment_verification_failed");
    expect(await s.store.get(channelId)).toMatchObject({ held: 0n, spent: 1234n, units: 1 });
  });

  it("holds nothing when the bucket is used up, but accepts the voucher (the Reserve then asks for a refresh)", async () => {
    const quote = setup().payments.challenge(paidRequest()).quote;
    const { s, channelId, pay } = await session(quote);
    expect((await pay(quote, "req_1")).held).toBeDefined();
    const full = await pay(quote, "req_2");
    expect(full.held).toBeUndefined();
    expect(deserializeSessionReceipt(full.verified.acceptedReceipt!)).toMatchObject({ spent: "0", units: 0 });
    expect((await s.store.get(channelId))?.held).toBe(quote);
    await rejects(
      s.payments.reserve(channelId, "req_2", quote.toString(), full.issued.id),
      "mpp_voucher_bucket_refresh_required",
    );
  });

  it("still checks each request's own binding when the voucher is reused: body, route and expiry", async () => {
    const { s, channelId, payer, pay } = await session();
    const first = await pay(2n * UNIT, "req_1");
    expect(first.held).toBeDefined();
    const req = paidRequest();
    const issued = s.payments.challenge(req);
    const authorization = payer.credential(issued.header, await payer.voucher(2n * UNIT));
    const send = (body: Uint8Array, path = PATH) =>
      s.payments.verifyAndReserve({ authorization, httpMethod: "POST", path, body }, "req_2");
    await rejects(send(paidRequest({ content: "Say goodbye." }).body), "mpp_body_digest_mismatch");
    await rejects(send(req.body, "/v1/mpp/other"), "mpp_invalid_challenge");
    s.advance(301_000);
    await rejects(send(req.body), "mpp_invalid_challenge");
    // Only the first request's hold: none of the refused ones took any.
    expect((await s.store.get(channelId))?.held).toBe(first.issued.quote);
  });

  it("refuses a reused voucher once the payer asked to close on chain, holding nothing", async () => {
    const { s, channelId, pay } = await session();
    s.advance(10_000);
    s.chain.states.set(channelId, { deposit: 5n * UNIT, settled: 0n, closeRequestedAt: 1_700_000_000 });
    await rejects(pay(2n * UNIT, "req_1"), "mpp_payment_verification_failed");
    expect((await s.store.get(channelId))?.held).toBe(0n);
  });

  it("refuses a reused voucher on a closing channel, holding nothing", async () => {
    const { s, channelId, pay } = await session();
    expect((await s.store.beginClose(channelId, T0, 60_000)).kind).toBe("ok");
    await rejects(pay(2n * UNIT, "req_1"), "mpp_payment_verification_failed");
    expect((await s.store.get(channelId))?.held).toBe(0n);
  });
});

describe("One challenge, one request (docs/paid-door.md): a replayed credential", () => {
  /** A payer's channel (voucher 2 units) and one paid request's credential, not yet sent. */
  async function replayable() {
    const s = setup();
    const o = await opened(s, 2n * UNIT);
    const credentialFor = async (action: "voucher" | "open" = "voucher", payer = o.payer) => {
      const req = paidRequest();
      const issued = s.payments.challenge(req);
      const payload = action === "open" ? await payer.open(UNIT) : await payer.voucher(2n * UNIT);
      return {
        issued,
        credential: {
          authorization: payer.credential(issued.header, payload),
          httpMethod: "POST",
          path: PATH,
          body: req.body,
        },
      };
    };
    return { s, ...o, credentialFor };
  }

  it("refuses the same challenge and body sent again with mpp_invalid_challenge, charging nothing", async () => {
    const { s, channelId, credentialFor } = await replayable();
    const { issued, credential } = await credentialFor();
    const first = await s.payments.verifyAndReserve(credential, "req_1");
    await s.payments.commit(first.held!.reservationId, channelId, issued.id, "1234");
    const err = await rejects(s.payments.verifyAndReserve(credential, "req_replay"), "mpp_invalid_challenge");
    expect(err.message).toBe("challenge was already used; obtain a new one");
    // The Reserve api-edge falls back to when Verify held nothing refuses it too.
    await rejects(
      s.payments.reserve(channelId, "req_replay_2", issued.quote.toString(), issued.id),
      "mpp_invalid_challenge",
    );
    expect(await s.store.get(channelId)).toMatchObject({ held: 0n, spent: 1234n, units: 1 });
    // The payer's next request: its receipt reports only the payer's own spend.
    const next = await credentialFor();
    const second = await s.payments.verifyAndReserve(next.credential, "req_2");
    expect(deserializeSessionReceipt(second.held!.receipt)).toMatchObject({
      challengeId: next.issued.id,
      spent: "1234",
      units: 1,
    });
  });

  it("serves exactly one of concurrent replays of one credential", async () => {
    const { s, channelId, credentialFor } = await replayable();
    const { issued, credential } = await credentialFor();
    const results = await Promise.allSettled(
      ["a", "b", "c", "d"].map((id) => s.payments.verifyAndReserve(credential, `req_${id}`)),
    );
    const served = results.filter((r) => r.status === "fulfilled" && r.value.held !== undefined);
    const refused = results.filter(
      (r) => r.status === "rejected" && (r.reason as PaymentError).code === "mpp_invalid_challenge",
    );
    expect([served.length, refused.length]).toEqual([1, 3]);
    expect(await s.store.get(channelId)).toMatchObject({ held: issued.quote, spent: 0n });
  });

  it("refuses a replayed open with a body once its challenge paid for a request", async () => {
    const s = setup();
    const payer = new TestPayer(PAYEE);
    const req = paidRequest();
    const issued = s.payments.challenge(req);
    const credential = {
      authorization: payer.credential(issued.header, await payer.open(UNIT)),
      httpMethod: "POST",
      path: PATH,
      body: req.body,
    };
    const first = await s.payments.verifyAndReserve(credential, "req_1");
    expect(first.held).toBeDefined();
    await rejects(s.payments.verifyAndReserve(credential, "req_2"), "mpp_invalid_challenge");
    expect(await s.store.get(payer.channelId)).toMatchObject({ held: issued.quote, spent: 0n });
    expect(s.chain.calls.filter((c) => c === "submitOpen")).toHaveLength(1);
  });

  it("answers a retry of the same request (the same request id) with the same hold", async () => {
    const { s, channelId, credentialFor } = await replayable();
    const { issued, credential } = await credentialFor();
    const first = await s.payments.verifyAndReserve(credential, "req_1");
    const retried = await s.payments.verifyAndReserve(credential, "req_1");
    expect(retried.held!.reservationId).toBe(first.held!.reservationId);
    expect(
      (await s.payments.reserve(channelId, "req_1", issued.quote.toString(), issued.id)).reservationId,
    ).toBe(first.held!.reservationId);
    expect((await s.store.get(channelId))?.held).toBe(issued.quote);
  });

  it("is not consumed by a hold that could not be taken: the Reserve that follows takes it", async () => {
    const { s, channelId, credentialFor } = await replayable();
    const { issued, credential } = await credentialFor();
    // The bucket is busy: Verify accepts the voucher but holds nothing.
    await s.payments.reserve(channelId, "busy_1", String(UNIT));
    const busy = await s.payments.reserve(channelId, "busy_2", String(UNIT - issued.quote + 1n));
    expect((await s.payments.verifyAndReserve(credential, "req_1")).held).toBeUndefined();
    await s.payments.release(busy.reservationId, channelId);
    await s.payments.reserve(channelId, "req_1b", issued.quote.toString(), issued.id);
    await rejects(s.payments.verifyAndReserve(credential, "req_2"), "mpp_invalid_challenge");
    expect((await s.store.get(channelId))?.held).toBe(UNIT + issued.quote);
  });

  it("lets bodyless management requests (topUp, close) reuse the consumed challenge", async () => {
    const { s, channelId, payer, credentialFor } = await replayable();
    const { issued, credential } = await credentialFor();
    const held = (await s.payments.verifyAndReserve(credential, "req_1")).held!;
    await s.payments.commit(held.reservationId, channelId, issued.id, "1234");
    const bodyless = (payload: Record<string, unknown>) => ({
      authorization: payer.credential(issued.header, payload),
      httpMethod: "POST",
      path: PATH,
      body: new Uint8Array(),
    });
    const topUp = await s.payments.verifyAndReserve(bodyless(payer.topUp(3n * UNIT)), "req_top");
    expect(topUp.verified.action).toBe("topUp");
    const close = bodyless(await payer.voucher(2n * UNIT, "close"));
    expect((await s.payments.verify(close)).action).toBe("close");
    expect(deserializeSessionReceipt(await s.payments.close(close))).toMatchObject({
      challengeId: issued.id,
      spent: "1234",
      units: 1,
    });
  });
});

describe("Reserve, Commit, Release", () => {
  it("holds the quote inside the accepted voucher and commits the actual cost into a receipt", async () => {
    const s = setup();
    const { issued, channelId } = await opened(s);
    const rid = (await s.payments.reserve(channelId, "req_1", issued.quote.toString())).reservationId;
    expect((await s.store.get(channelId))?.held).toBe(issued.quote);
    const header = await s.payments.commit(rid, channelId, issued.id, "1234");
    const receipt = deserializeSessionReceipt(header);
    expect(receipt).toEqual({
      method: "tempo",
      intent: "session",
      status: "success",
      timestamp: new Date(T0).toISOString(),
      reference: channelId,
      challengeId: issued.id,
      channelId,
      acceptedCumulative: "1000000",
      spent: "1234",
      units: 1,
    });
    expect(await s.store.get(channelId)).toMatchObject({ held: 0n, spent: 1234n, units: 1 });
    // Idempotent: the same reservation commits to the same receipt, and nothing is charged twice.
    s.advance(5_000);
    expect(await s.payments.commit(rid, channelId, issued.id, "9999")).toBe(header);
    expect((await s.store.get(channelId))?.spent).toBe(1234n);
    // metering's commit of the same hold from its usage event (no challenge) succeeds, charging nothing more.
    expect(deserializeSessionReceipt(await s.payments.commit(rid, channelId, "", "1234"))).toMatchObject({
      spent: "1234",
      units: 1,
    });
    expect(await s.store.get(channelId)).toMatchObject({ held: 0n, spent: 1234n, units: 1 });
  });

  it("charges at most the hold, says so in a counted warning, and refuses what does not fit the bucket", async () => {
    const over: { actual: bigint; charged: bigint }[] = [];
    const s = setup({ onOverHold: (o) => over.push(o) });
    const { issued, channelId } = await opened(s);
    const r1 = (await s.payments.reserve(channelId, "a", "600000")).reservationId;
    const r2 = (await s.payments.reserve(channelId, "b", "400000")).reservationId;
    await rejects(s.payments.reserve(channelId, "c", "1"), "mpp_voucher_bucket_refresh_required");
    expect(deserializeSessionReceipt(await s.payments.commit(r1, channelId, issued.id, "700000")).spent).toBe(
      "600000",
    );
    // A cost above the hold is a misbehaving or forged usage event: counted and logged, never charged.
    expect(over).toEqual([{ actual: 700000n, charged: 600000n }]);
    const warned = s.lines.filter((l) => l.includes("commit above its hold"));
    expect(warned).toHaveLength(1);
    expect(warned[0]).not.toContain(channelId.slice(2));
    await s.payments.release(r2, channelId);
    // 400000 left in the bucket.
    await rejects(s.payments.reserve(channelId, "d", "400001"), "mpp_voucher_bucket_refresh_required");
    await s.payments.reserve(channelId, "e", "400000");
    await rejects(
      s.payments.reserve(channelId, "f", String(UNIT + 1n)),
      "mpp_request_exceeds_voucher_bucket",
    );
    for (const quote of ["0", "-5", "abc", "1.5", ""]) {
      await rejects(s.payments.reserve(channelId, "g", quote), "mpp_request_quote_invalid");
    }
  });

  it("gives each hold the receipt before its cost: spent and units of that moment, within the accepted voucher", async () => {
    const s = setup();
    const { req, issued, channelId } = await opened(s);
    // One challenge per request: each hold consumes its own.
    const [second, third] = [s.payments.challenge(req), s.payments.challenge(req)];
    const first = await s.payments.reserve(channelId, "req_1", "300000", issued.id);
    const concurrent = await s.payments.reserve(channelId, "req_2", "200000", second.id);
    const at = { channelId, acceptedCumulative: "1000000" };
    expect(deserializeSessionReceipt(first.receipt)).toMatchObject({
      ...at,
      challengeId: issued.id,
      spent: "0",
      units: 0,
    });
    expect(deserializeSessionReceipt(concurrent.receipt)).toMatchObject({
      ...at,
      challengeId: second.id,
      spent: "0",
      units: 0,
    });
    await s.payments.commit(first.reservationId, channelId, issued.id, "1234");
    const next = await s.payments.reserve(channelId, "req_3", "100000", third.id);
    expect(deserializeSessionReceipt(next.receipt)).toMatchObject({
      ...at,
      challengeId: third.id,
      spent: "1234",
      units: 1,
    });
    // A retried reserve of a live hold answers the figures of now; without a challenge id, no receipt.
    expect((await s.payments.reserve(channelId, "req_2", "200000")).receipt).toBe("");
  });

  it("gives a retried reserve of one request the same reservation, holding once", async () => {
    const s = setup();
    const { channelId } = await opened(s);
    const a = (await s.payments.reserve(channelId, "req_same", "300000")).reservationId;
    const b = (await s.payments.reserve(channelId, "req_same", "300000")).reservationId;
    expect(b).toBe(a);
    expect((await s.store.get(channelId))?.held).toBe(300_000n);
  });

  it("gives every request id its own hold, and a voucher's accepted receipt reports the spend before it", async () => {
    const s = setup();
    const { req, payer, channelId } = await opened(s);
    const a = (await s.payments.reserve(channelId, "req_a", "300000")).reservationId;
    const b = (await s.payments.reserve(channelId, "req_b", "200000")).reservationId;
    expect(b).not.toBe(a);
    expect((await s.store.get(channelId))?.held).toBe(500_000n);
    await s.payments.commit(a, channelId, "ch", "1234");
    await s.payments.commit(b, channelId, "ch", "766");
    const issued = s.payments.challenge(req);
    const verified = await s.payments.verify({
      authorization: payer.credential(issued.header, await payer.voucher(2n * UNIT)),
      httpMethod: "POST",
      path: PATH,
      body: req.body,
    });
    expect(deserializeSessionReceipt(verified.acceptedReceipt!)).toMatchObject({
      challengeId: issued.id,
      channelId,
      acceptedCumulative: String(2n * UNIT),
      spent: "2000",
      units: 2,
    });
  });

  it("on a failed inference, Release returns the hold and no receipt can follow", async () => {
    const s = setup();
    const { issued, channelId } = await opened(s);
    const before = await s.store.get(channelId);
    const rid = (await s.payments.reserve(channelId, "req_fail", issued.quote.toString())).reservationId;
    await s.payments.release(rid, channelId);
    await s.payments.release(rid, channelId);
    const after = await s.store.get(channelId);
    expect(after).toEqual(before);
    // Says why, so that metering's commit from the usage event knows not to retry it.
    expect(
      await rejects(s.payments.commit(rid, channelId, issued.id, "1"), "mpp_commit_failed"),
    ).toMatchObject({
      hold: "released",
    });
  });

  it("lets an abandoned hold expire after the reservation TTL", async () => {
    const s = setup({ settings: { reservationTtlSeconds: 60 } });
    const { issued, channelId } = await opened(s);
    const rid = (await s.payments.reserve(channelId, "lost", String(UNIT))).reservationId;
    await rejects(s.payments.reserve(channelId, "next", "1"), "mpp_voucher_bucket_refresh_required");
    s.advance(60_000);
    await s.payments.reserve(channelId, "next", String(UNIT));
    expect(
      await rejects(s.payments.commit(rid, channelId, issued.id, "1"), "mpp_commit_failed"),
    ).toMatchObject({
      hold: "expired",
    });
  });

  it("answers store failures and unknown sessions with mpp_reservation_failed and mpp_commit_failed", async () => {
    const s = setup();
    const { issued, channelId } = await opened(s);
    await rejects(s.payments.reserve(new TestPayer(PAYEE).channelId, "x", "1"), "mpp_reservation_failed");
    await rejects(s.payments.reserve("0x1234", "x", "1"), "mpp_reservation_failed");
    const broken: ChannelStore = {
      ...s.store,
      reserve: () => Promise.reject(new Error("connection lost")),
      commit: () => Promise.reject(new Error("connection lost")),
    };
    const b = setup({ store: broken, chain: s.chain });
    await rejects(b.payments.reserve(channelId, "y", "1"), "mpp_reservation_failed");
    const rid = (await s.payments.reserve(channelId, "z", "1")).reservationId;
    // A store failure names no hold: the caller may retry it.
    expect((await rejects(b.payments.commit(rid, channelId, issued.id, "1"), "mpp_commit_failed")).hold).toBe(
      undefined,
    );
    expect(
      await rejects(s.payments.commit("rsv_unknown", channelId, issued.id, "1"), "mpp_commit_failed"),
    ).toMatchObject({ hold: "unknown" });
    expect(
      await rejects(
        s.payments.commit(`rsv_${"0".repeat(32)}`, channelId, issued.id, "1"),
        "mpp_commit_failed",
      ),
    ).toMatchObject({ hold: "unknown" });
  });
});

describe("Close", () => {
  async function closeCredential(o: Awaited<ReturnType<typeof opened>>, cumulative: bigint) {
    return {
      authorization: o.payer.credential(o.issued.header, await o.payer.voucher(cumulative, "close")),
      httpMethod: "POST",
      path: PATH,
      body: new Uint8Array(),
    };
  }
  async function closeWith(s: Setup, o: Awaited<ReturnType<typeof opened>>, cumulative: bigint) {
    return s.payments.close(await closeCredential(o, cumulative));
  }

  it("captures exactly the spend, returns a receipt with the tx hash, and answers a retry alike", async () => {
    const s = setup();
    const o = await opened(s);
    const rid = (await s.payments.reserve(o.channelId, "r", "5000")).reservationId;
    await s.payments.commit(rid, o.channelId, o.issued.id, "4321");
    // Verify recognizes a close credential without acting on it.
    const v = await s.payments.verify({
      authorization: o.payer.credential(o.issued.header, await o.payer.voucher(UNIT, "close")),
      httpMethod: "POST",
      path: PATH,
      body: new Uint8Array(),
    });
    expect(v.action).toBe("close");
    expect(s.chain.calls).not.toContain("close");
    const receipt = deserializeSessionReceipt(await closeWith(s, o, UNIT));
    expect(receipt).toMatchObject({
      challengeId: o.issued.id,
      channelId: o.channelId,
      acceptedCumulative: "1000000",
      spent: "4321",
      units: 1,
    });
    expect(receipt.txHash).toMatch(/^0x[0-9a-f]{64}$/);
    expect(await s.store.get(o.channelId)).toMatchObject({ status: "closed", settled: 4321n });
    const again = deserializeSessionReceipt(await closeWith(s, o, UNIT));
    expect(again).toMatchObject({ txHash: receipt.txHash, spent: "4321", acceptedCumulative: "1000000" });
    expect(s.chain.calls.filter((c) => c === "close")).toHaveLength(1);
    await rejects(s.payments.reserve(o.channelId, "after", "1"), "mpp_reservation_failed");
  });

  it("allows close(0) on an untouched channel", async () => {
    const s = setup();
    const o = await opened(s);
    const receipt = deserializeSessionReceipt(await closeWith(s, o, 0n));
    expect(receipt).toMatchObject({ acceptedCumulative: "0", spent: "0" });
  });

  it("refuses a close below the spend", async () => {
    const s = setup();
    const o = await opened(s);
    await s.payments.commit(
      (await s.payments.reserve(o.channelId, "r", "5000")).reservationId,
      o.channelId,
      o.issued.id,
      "5000",
    );
    await rejects(closeWith(s, o, 4999n), "mpp_payment_verification_failed");
  });

  it("without a payee key answers mpp_session_close_unavailable and the session stays open", async () => {
    const s = setup();
    s.chain.canSend = false;
    const o = await opened(s);
    await rejects(closeWith(s, o, UNIT), "mpp_session_close_unavailable");
    expect((await s.store.get(o.channelId))?.status).toBe("open");
    await s.payments.reserve(o.channelId, "r", "1");
  });

  it("rolls the closing mark back when the close transaction fails, and refuses while requests are in flight", async () => {
    const s = setup();
    const o = await opened(s);
    s.chain.failClose = true;
    await rejects(closeWith(s, o, UNIT), "mpp_session_close_failed");
    expect((await s.store.get(o.channelId))?.status).toBe("open");
    s.chain.failClose = false;
    const rid = (await s.payments.reserve(o.channelId, "inflight", "1")).reservationId;
    await rejects(
      setup({ store: s.store, chain: s.chain, closeWaitMs: 50 }).payments.close(
        await closeCredential(o, UNIT),
      ),
      "mpp_session_close_failed",
    );
    await s.payments.release(rid, o.channelId);
    expect(deserializeSessionReceipt(await closeWith(s, o, UNIT)).spent).toBe("0");
  });

  it("waits for a Commit still on its way after the answer, and captures it", async () => {
    const s = setup();
    const o = await opened(s);
    const held = await s.payments.reserve(o.channelId, "answered", "5000", o.issued.id);
    // api-edge answered with the receipt of the hold plus its charge, and sends Commit after it;
    // the payer's close arrives first.
    const told = deserializeSessionReceipt(held.receipt);
    const closing = closeWith(s, o, UNIT);
    await new Promise((r) => setTimeout(r, 30));
    await s.payments.commit(held.reservationId, o.channelId, o.issued.id, "4321");
    const receipt = deserializeSessionReceipt(await closing);
    expect(receipt.spent).toBe(String(BigInt(told.spent) + 4321n));
    expect(await s.store.get(o.channelId)).toMatchObject({ status: "closed", held: 0n, spent: 4321n });
  });
});

describe("logging", () => {
  it("never writes credentials, signatures, addresses, receipts or the body to a log line", async () => {
    const s = setup();
    const o = await opened(s);
    const secretBits: string[] = [o.payer.account.address, PAYEE, o.channelId];
    const voucher = await o.payer.voucher(2n * UNIT);
    secretBits.push(voucher["signature"] as string);
    await s.payments.verify({
      authorization: o.payer.credential(o.issued.header, voucher),
      httpMethod: "POST",
      path: PATH,
      body: o.req.body,
    });
    const receipt = await s.payments.commit(
      (await s.payments.reserve(o.channelId, "r", "10")).reservationId,
      o.channelId,
      o.issued.id,
      "10",
    );
    secretBits.push(receipt);
    s.chain.failSubmit = true;
    const other = new TestPayer(PAYEE);
    await rejects(
      s.payments.verify({
        authorization: other.credential(o.issued.header, await other.open(UNIT)),
        httpMethod: "POST",
        path: PATH,
        body: o.req.body,
      }),
      "mpp_payment_verification_failed",
    );
    secretBits.push(other.account.address, other.channelId);
    s.chain.failClose = true;
    await rejects(
      s.payments.close({
        authorization: o.payer.credential(o.issued.header, await o.payer.voucher(2n * UNIT, "close")),
        httpMethod: "POST",
        path: PATH,
        body: new Uint8Array(),
      }),
      "mpp_session_close_failed",
    );
    expect(s.lines.length).toBeGreaterThan(2);
    const text = s.lines.join("\n").toLowerCase();
    for (const bit of secretBits) expect(text).not.toContain(bit.toLowerCase().slice(2, 30));
    expect(text).not.toContain("say hello");
    expect(text).not.toMatch(/0x[0-9a-f]{16,}/);
  });
});
