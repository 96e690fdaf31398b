import { Challenge, Credential } from "mppx";
import type { Address } from "viem";
import { assertSameChannel, type ChannelState } from "./channel.js";
import { type Problem, readProblem } from "./problem.js";
import { challengeOf, readTerms, type SessionTerms } from "./terms.js";

/** The HTTP side of a session: POSTs to the paid route, with or without a Payment credential. */
export class Exchange {
  constructor(
    readonly url: string,
    private readonly options: {
      payer: Address;
      trustedEscrow: Address;
      timeoutMs: number;
      fetch: typeof globalThis.fetch;
    },
  ) {}

  terms(challenge: Challenge.Challenge): SessionTerms {
    return readTerms(challenge, this.options.trustedEscrow);
  }

  credential(terms: SessionTerms, payload: Record<string, unknown>): string {
    return Credential.serialize(
      Credential.from({
        challenge: terms.challenge,
        payload,
        source: `did:pkh:eip155:${terms.chainId}:${this.options.payer}`,
      }),
    );
  }

  async post(
    body: string | undefined,
    challenge?: Challenge.Challenge,
    credential?: string,
  ): Promise<Response> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (challenge && credential) headers[Challenge.credentialHeader(challenge)] = credential;
    else headers["accept-payment"] = "tempo/session";
    return this.options.fetch(this.url, {
      method: "POST",
      headers,
      ...(body !== undefined ? { body } : {}),
      signal: AbortSignal.timeout(this.options.timeoutMs),
    });
  }

  /** A bodyless POST with a management credential; one retry with the fresh challenge of a 402 (as mppx). */
  async postManagement(
    challenge: Challenge.Challenge,
    payload: Record<string, unknown>,
    channel: ChannelState,
  ): Promise<{ response: Response; problem: Problem; challenge: Challenge.Challenge }> {
    let used = challenge;
    let response = await this.post(undefined, used, this.credential(this.terms(used), payload));
    if (response.status === 402) {
      const fresh = challengeOf(response);
      if (!fresh) return { response, problem: await readProblem(response), challenge: used };
      await response.body?.cancel();
      used = fresh;
      assertSameChannel(channel, this.terms(used));
      response = await this.post(undefined, used, this.credential(this.terms(used), payload));
    }
    if (response.ok) {
      await response.body?.cancel();
      return { response, problem: {}, challenge: used };
    }
    return { response, problem: await readProblem(response), challenge: used };
  }
}
