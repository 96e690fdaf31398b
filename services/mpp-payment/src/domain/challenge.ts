import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { Challenge, Credential, PaymentRequest } from "mppx";
import type { Address } from "viem";
import type { PaidRequest, PricedRequest } from "./catalog.js";
import { PaymentError } from "./errors.js";
import type { PaymentSettings } from "./settings.js";

/** What a challenge binds besides the body digest; HMAC-protected through the challenge id. */
export interface Binding {
  httpMethod: string;
  path: string;
  plan: string;
  model: string;
  runtime: string;
  pricingSnapshotId: string;
  inputCap: number;
  outputCap: number;
}

/** A challenge ready for the WWW-Authenticate header. */
export interface IssuedChallenge {
  /** The header value: `Payment id="…", realm="…", method="tempo", intent="session", …`. */
  header: string;
  id: string;
  binding: Binding;
  quote: bigint;
}

/** The fields of a challenge a credential echoes that verification reads. */
interface EchoedChallenge {
  id: string;
  realm: string;
  expires?: string | undefined;
  digest?: string | undefined;
  opaque?: string | undefined;
  /**
   * The payment terms: their text as echoed when the id was checked over that text
   * (`idOverEcho`), else as mppx decoded them.
   */
  request: string | Record<string, unknown>;
}

/** A Payment credential taken apart; its challenge's id checked, the rest not yet verified. */
export interface PresentedCredential {
  challenge: EchoedChallenge;
  /** Whether the challenge's id is this service's HMAC over its fields: it issued them. */
  issued: boolean;
  payload: Record<string, unknown>;
  source: string | undefined;
}

/** A credential whose challenge this service issued, unexpired, for this route and config. */
export interface VerifiedChallenge {
  id: string;
  /** The body digest the challenge bound (mppx's format, see bodyDigest). */
  digest: string;
  binding: Binding;
  /** The quote bound at challenge time. */
  quote: bigint;
  /** When the challenge expires (ms since the epoch). */
  expires: number;
}

/** The session method and intent: tempo/session, the only one the paid door accepts. */
export const METHOD = "tempo";
export const INTENT = "session";
/** Version of the opaque meta layout, so a later change can tell old challenges apart. */
const META_VERSION = "1";

/** mppx's digest format: `sha-256=` and the padded standard base64 of SHA-256 over the raw bytes. */
export function bodyDigest(body: Uint8Array): string {
  return `sha-256=${createHash("sha256").update(body).digest("base64")}`;
}

/**
 * The session `request` of every challenge (the payment terms the client signs against); mppx
 * serializes it JCS-canonical.
 */
export function sessionRequest(s: PaymentSettings): Record<string, unknown> {
  return {
    amount: s.bucket.toString(),
    currency: s.currency,
    recipient: s.recipient,
    suggestedDeposit: s.suggestedDeposit.toString(),
    unitType: "request",
    methodDetails: { chainId: s.chainId, escrowContract: s.escrow, sessionProtocol: "v2" },
  };
}

/** Builds the 402 challenge of a priced request (docs/contract.md, "The paid door", rule 1). */
export function issueChallenge(
  s: PaymentSettings,
  req: PaidRequest,
  priced: PricedRequest,
  now: number,
): IssuedChallenge {
  const binding: Binding = {
    httpMethod: req.httpMethod,
    path: req.path,
    plan: priced.plan,
    model: priced.model.id,
    runtime: priced.model.runtime,
    pricingSnapshotId: priced.pricingSnapshotId,
    inputCap: priced.inputCap,
    outputCap: priced.outputCap,
  };
  const meta: Record<string, string> = {
    v: META_VERSION,
    method: binding.httpMethod,
    path: binding.path,
    plan: binding.plan,
    model: binding.model,
    runtime: binding.runtime,
    pricing: binding.pricingSnapshotId,
    inputCap: String(binding.inputCap),
    outputCap: String(binding.outputCap),
    quote: priced.quote.toString(),
    // Replay metadata: every challenge is a new one, even for the same body in the same
    // millisecond, since one challenge pays for one request (docs/paid-door.md, "One
    // challenge, one request").
    nonce: randomBytes(16).toString("base64url"),
  };
  const challenge = Challenge.from({
    secretKey: s.secret,
    realm: s.realm,
    method: METHOD,
    intent: INTENT,
    request: sessionRequest(s),
    digest: bodyDigest(req.body),
    expires: new Date(now + s.challengeTtlSeconds * 1000).toISOString(),
    meta,
  });
  return { header: Challenge.serialize(challenge), id: challenge.id, binding, quote: priced.quote };
}

const BASE64URL = /^[A-Za-z0-9_-]+={0,2}$/;

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Takes an Authorization header apart: mpp_malformed_credential when it is missing, too large,
 * not `Payment <base64url JSON>` or has no challenge and payload; mpp_invalid_challenge when the
 * echoed challenge is malformed; mpp_method_unsupported when it is not tempo/session.
 */
export function presentCredential(authorization: string, s: PaymentSettings): PresentedCredential {
  const malformed = (message: string) => new PaymentError("mpp_malformed_credential", message);
  if (authorization.trim() === "") throw malformed("payment credential is missing");
  if (Buffer.byteLength(authorization, "utf8") > s.maxCredentialBytes) {
    throw malformed("payment credential is too large");
  }
  const scheme = Credential.extractPaymentScheme(authorization);
  if (!scheme) {
    if (authorization.split(",").some((s) => s.trim().toLowerCase() === "payment")) {
      throw malformed("payment credential is missing");
    }
    throw malformed("not an Authorization: Payment credential");
  }
  const token = scheme.replace(/^\S+\s+/, "").trim();
  if (!BASE64URL.test(token)) throw malformed("payment credential is not base64url");
  let wire: unknown;
  try {
    wire = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw malformed("payment credential is not base64url JSON");
  }
  if (!isRecord(wire) || !isRecord(wire["challenge"]) || !isRecord(wire["payload"])) {
    throw malformed("payment credential has no challenge and payload");
  }
  if (wire["source"] !== undefined && typeof wire["source"] !== "string") {
    throw malformed("payment credential source is not a string");
  }
  const echoed = wire["challenge"];
  if (idOverEcho(echoed, s.secret)) {
    // The fields are the ones this service issued, byte for byte: nothing to decode or re-encode.
    return {
      challenge: echoedFields(echoed),
      issued: true,
      payload: wire["payload"],
      // As mppx reads it: an empty source is none.
      source: (wire["source"] as string | undefined) || undefined,
    };
  }
  let credential: Credential.Credential;
  try {
    credential = Credential.deserialize(scheme);
  } catch {
    throw new PaymentError("mpp_invalid_challenge", "challenge is malformed or misses required fields");
  }
  if (credential.challenge.method !== METHOD || credential.challenge.intent !== INTENT) {
    throw new PaymentError("mpp_method_unsupported", "only tempo session credentials are accepted");
  }
  return {
    challenge: echoedFields(credential.challenge),
    issued: Challenge.verify(credential.challenge, { secretKey: s.secret }),
    payload: credential.payload as Record<string, unknown>,
    source: credential.source,
  };
}

/** The fields verification reads, from the echo as sent or as mppx decoded it. */
function echoedFields({ id, realm, expires, digest, opaque, request }: EchoedChallenge): EchoedChallenge {
  return { id, realm, expires, digest, opaque, request };
}

/** An echoed challenge whose fields are the texts this service issued. */
type IssuedEcho = Record<string, unknown> &
  Record<"id" | "realm" | "method" | "intent" | "request" | "expires" | "digest" | "opaque", string>;

/**
 * Whether a credential's echoed challenge is one this service issued, exactly as it issued it:
 * tempo/session, with expiry, digest and opaque, no other credential header, and an id that is
 * the HMAC-SHA256 (base64url, unpadded) of `realm|method|intent|request|expires|digest|opaque`
 * over the echoed texts (docs/paid-door.md, "The challenge id"). The id is compared as text, in
 * constant time: one issued challenge has one id, the key of its single use. False sends the
 * credential down mppx's own reading, which decodes and re-encodes the request and opaque, and
 * accepts the forms this does not (an older client's expanded opaque, say).
 */
export function idOverEcho(echoed: Record<string, unknown>, secret: string): echoed is IssuedEcho {
  const { id, realm, method, intent, request, expires, digest, opaque } = echoed;
  if (
    typeof id !== "string" ||
    typeof realm !== "string" ||
    method !== METHOD ||
    intent !== INTENT ||
    typeof request !== "string" ||
    typeof expires !== "string" ||
    typeof digest !== "string" ||
    typeof opaque !== "string" ||
    echoed["header"] !== undefined ||
    echoed["meta"] !== undefined
  ) {
    return false;
  }
  const expected = createHmac("sha256", secret)
    .update(`${realm}|${method}|${intent}|${request}|${expires}|${digest}|${opaque}`)
    .digest("base64url");
  const sent = Buffer.from(id, "utf8");
  return sent.length === expected.length && timingSafeEqual(sent, Buffer.from(expected, "utf8"));
}

/** The text of the payment terms this service issues now, made once per settings. */
const issuedTerms = new WeakMap<PaymentSettings, string>();
function termsText(s: PaymentSettings): string {
  let text = issuedTerms.get(s);
  if (text === undefined) {
    text = PaymentRequest.serialize(sessionRequest(s));
    issuedTerms.set(s, text);
  }
  return text;
}

function sameAddress(a: unknown, b: Address): boolean {
  return typeof a === "string" && a.toLowerCase() === b.toLowerCase();
}

/**
 * Why the echoed request differs from what this service issues now (a credential answering a
 * challenge made under other prices, caps or chain settings is refused); undefined when it matches.
 */
function requestMismatch(echoed: string | Record<string, unknown>, s: PaymentSettings): string | undefined {
  let request: Record<string, unknown>;
  if (typeof echoed === "string") {
    // The terms this service issues now, as text: nothing to compare field by field.
    if (echoed === termsText(s)) return undefined;
    try {
      const decoded: unknown = PaymentRequest.deserialize(echoed);
      if (!isRecord(decoded)) return "request";
      request = decoded;
    } catch {
      return "request";
    }
  } else {
    request = echoed;
  }
  const details = isRecord(request["methodDetails"]) ? request["methodDetails"] : {};
  if (request["amount"] !== s.bucket.toString()) return "amount";
  if (!sameAddress(request["currency"], s.currency)) return "currency";
  if (!sameAddress(request["recipient"], s.recipient)) return "recipient";
  if (request["unitType"] !== "request") return "unitType";
  if (details["chainId"] !== s.chainId) return "chainId";
  if (!sameAddress(details["escrowContract"], s.escrow)) return "escrowContract";
  if (details["sessionProtocol"] !== "v2") return "sessionProtocol";
  if (details["operator"] !== undefined || details["feePayer"] !== undefined) return "methodDetails";
  return undefined;
}

const CAP = /^(0|[1-9][0-9]{0,9})$/;

function bindingOf(meta: Record<string, unknown>): { binding: Binding; quote: bigint } | undefined {
  const str = (k: string) => (typeof meta[k] === "string" ? (meta[k] as string) : undefined);
  const [v, method, path, plan, model, runtime, pricing, inputCap, outputCap, quote] = [
    "v",
    "method",
    "path",
    "plan",
    "model",
    "runtime",
    "pricing",
    "inputCap",
    "outputCap",
    "quote",
  ].map(str);
  if (v !== META_VERSION || !method || !path || !plan || !model || runtime === undefined || !pricing) {
    return undefined;
  }
  if (!inputCap || !CAP.test(inputCap) || !outputCap || !CAP.test(outputCap)) return undefined;
  if (!quote || !/^[1-9][0-9]{0,29}$/.test(quote)) return undefined;
  return {
    binding: {
      httpMethod: method,
      path,
      plan,
      model,
      runtime,
      pricingSnapshotId: pricing,
      inputCap: Number(inputCap),
      outputCap: Number(outputCap),
    },
    quote: BigInt(quote),
  };
}

/**
 * Checks that this service issued the echoed challenge (HMAC over realm, method, intent, request,
 * expires, digest and opaque), that it has not expired, that its request still matches the current
 * config and that it was issued for this route. Every failure is mpp_invalid_challenge. This is
 * stateless: it does not tell a replayed credential from a fresh one. A content request's
 * challenge is single-use, and that is the store's to enforce: the first hold taken under a
 * challenge id consumes it, and any other request presenting it is refused mpp_invalid_challenge
 * in the store step that would have held (holds.ts, challengeUse; docs/paid-door.md, "One
 * challenge, one request"). Cumulative vouchers do not bound a replay: a byte-identical voucher
 * is the accepted one again. Bodyless management requests (topUp, close) take no hold and may
 * reuse the current challenge (credential.ts).
 */
export function verifyChallenge(
  presented: PresentedCredential,
  s: PaymentSettings,
  route: { httpMethod: string; path: string },
  now: number,
): VerifiedChallenge {
  const invalid = (message: string) => new PaymentError("mpp_invalid_challenge", message);
  const { challenge } = presented;
  if (challenge.realm !== s.realm || !presented.issued) {
    throw invalid("challenge was not issued by this service");
  }
  if (!challenge.expires) throw invalid("challenge has no expiry");
  const expires = Date.parse(challenge.expires);
  if (Number.isNaN(expires)) throw invalid("challenge expiry is malformed");
  if (expires <= now) throw invalid("challenge has expired");
  if (!challenge.digest) throw invalid("challenge has no body digest");
  if (requestMismatch(challenge.request, s) !== undefined) {
    throw invalid("challenge does not match the current payment configuration");
  }
  let meta: unknown;
  try {
    meta = challenge.opaque ? PaymentRequest.deserialize(challenge.opaque) : undefined;
  } catch {
    meta = undefined;
  }
  const bound = isRecord(meta) ? bindingOf(meta) : undefined;
  if (!bound) throw invalid("challenge misses its binding");
  if (bound.binding.httpMethod !== route.httpMethod || bound.binding.path !== route.path) {
    throw invalid("challenge was issued for another route");
  }
  return { id: challenge.id, digest: challenge.digest, binding: bound.binding, quote: bound.quote, expires };
}

/** mpp_body_digest_mismatch unless `body` is byte-identical to the body the challenge bound
 * (docs/contract.md, "The paid door", rule 2; docs/decisions/0003-digest-mismatch-402.md). */
export function checkBodyDigest(digest: string, body: Uint8Array): void {
  const expected = Buffer.from(digest, "utf8");
  const actual = Buffer.from(bodyDigest(body), "utf8");
  if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) {
    throw new PaymentError(
      "mpp_body_digest_mismatch",
      "request body differs from the body bound into the challenge",
    );
  }
}
