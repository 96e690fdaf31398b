import { Challenge } from "mppx";
import { type Address, isAddressEqual } from "viem";
import { DEFAULT_ESCROW, PaidSessionError } from "./types.js";
import { address, parseAmount } from "./values.js";

const ZERO_ADDRESS: Address = "0x0000000000000000000000000000000000000000";
/** A challenge this close to its expiry is not reused for a management POST (close). */
const CHALLENGE_SAFETY_MS = 5_000;

/** The payment terms of one `tempo/session` v2 challenge. */
export interface SessionTerms {
  challenge: Challenge.Challenge;
  amount: bigint;
  suggestedDeposit: bigint | undefined;
  chainId: number;
  escrow: Address;
  payee: Address;
  token: Address;
  operator: Address;
  feePayer: boolean;
  feeToken: Address | undefined;
}

export function readTerms(challenge: Challenge.Challenge, trustedEscrow: Address): SessionTerms {
  const invalid = (why: string) => new PaidSessionError("challenge_invalid", `payment challenge: ${why}`);
  if (challenge.method !== "tempo" || challenge.intent !== "session") {
    throw invalid(`${challenge.method}/${challenge.intent} is not tempo/session`);
  }
  if (challenge.expires && Date.parse(challenge.expires) <= Date.now()) throw invalid("expired");
  const request = challenge.request as Record<string, unknown>;
  const details = (request["methodDetails"] ?? {}) as Record<string, unknown>;
  if (details["sessionProtocol"] !== "v2") throw invalid("not a TIP-1034 (sessionProtocol v2) session");
  const chainId = details["chainId"];
  if (typeof chainId !== "number" || !Number.isSafeInteger(chainId)) throw invalid("no chainId");
  const escrow = address(details["escrowContract"]) ?? DEFAULT_ESCROW;
  if (!isAddressEqual(escrow, trustedEscrow)) throw invalid(`untrusted escrow ${escrow}`);
  const payee = address(request["recipient"]);
  const token = address(request["currency"]);
  if (!payee || !token) throw invalid("no recipient or currency");
  const amount = parseAmount(request["amount"]);
  if (amount === undefined || amount === 0n) throw invalid("no positive amount");
  const suggested = request["suggestedDeposit"];
  const suggestedDeposit = suggested === undefined ? undefined : parseAmount(suggested);
  if (suggested !== undefined && suggestedDeposit === undefined) throw invalid("malformed suggestedDeposit");
  return {
    challenge,
    amount,
    suggestedDeposit,
    chainId,
    escrow,
    payee,
    token,
    operator: address(details["operator"]) ?? ZERO_ADDRESS,
    feePayer: details["feePayer"] === true,
    feeToken: address(details["feeToken"]),
  };
}

function isSessionChallenge(challenge: Challenge.Challenge): boolean {
  const details = (challenge.request as { methodDetails?: { sessionProtocol?: unknown } }).methodDetails;
  return challenge.method === "tempo" && challenge.intent === "session" && details?.sessionProtocol === "v2";
}

/** The response's tempo/session v2 challenge; the body is consumed when it was not yet. */
export async function takeChallenge(response: Response): Promise<Challenge.Challenge> {
  if (!response.bodyUsed) await response.body?.cancel();
  const challenge = challengeOf(response);
  if (!challenge) {
    throw new PaidSessionError(
      "challenge_invalid",
      `the ${response.status} carries no tempo/session (v2) payment challenge`,
      { status: response.status },
    );
  }
  return challenge;
}

/** The first tempo/session v2 challenge of `WWW-Authenticate`, if any (headers only). */
export function challengeOf(response: Response): Challenge.Challenge | undefined {
  try {
    return Challenge.fromResponseList(response).find(isSessionChallenge);
  } catch {
    return undefined;
  }
}

export function expiresSoon(challenge: Challenge.Challenge): boolean {
  return challenge.expires !== undefined && Date.parse(challenge.expires) - CHALLENGE_SAFETY_MS <= Date.now();
}
