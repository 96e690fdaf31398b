import { randomUUID } from "node:crypto";
import { createClient, RemoteError } from "@tollgate/kit/grpc";
import { Action, PaymentService } from "@tollgate/proto/payment";

/** A PaymentService client on a replica's port. */
export function paymentClient(port: number) {
  return createClient(PaymentService, `127.0.0.1:${port}`);
}

/** A typed PaymentService client. */
export type PaymentClient = ReturnType<typeof paymentClient>;

/** What the stand-in route saw, for assertions. */
export interface RouteLog {
  /** Every credentialed request: its Authorization and body (tests replay them). */
  paid: Array<{ authorization: string; body: Uint8Array; action: Action }>;
  /** Domain codes the service answered with. */
  codes: string[];
}

/** Options of the stand-in route. */
export interface PaidRouteOptions {
  /** Actual cost of a served request from its quote. Default: half the quote. */
  actualCost?: (quote: bigint) => bigint;
  /** Other replicas that verify every credential at the same time (concurrency tests). */
  alsoVerifyOn?: PaymentClient[];
}

/**
 * A `fetch` that plays api-edge's POST /v1/mpp/chat/completions against mpp-payment over gRPC,
 * so the unmodified mppx client can drive the service: unpaid → Challenge → 402; paid →
 * Verify, then Reserve → (inference) → Commit → 200 + Payment-Receipt; topUp → 204 + receipt;
 * close → Close → 204 + receipt; a refused credential → 402 with a fresh challenge.
 */
export function paidRoute(
  client: PaymentClient,
  opts: PaidRouteOptions = {},
): { fetch: typeof globalThis.fetch; log: RouteLog } {
  const log: RouteLog = { paid: [], codes: [] };
  const actualCost = opts.actualCost ?? ((quote: bigint) => quote / 2n);
  let lastBody: Uint8Array | undefined;

  const challenge = async (method: string, path: string, body: Uint8Array) => {
    const json = JSON.parse(Buffer.from(body).toString("utf8")) as {
      plan: string;
      model_optimization: boolean;
      model?: string;
      max_tokens: number;
      messages: unknown[];
    };
    const res = await client.challenge({
      request: {
        httpMethod: method,
        path,
        plan: json.plan,
        modelOptimization: json.model_optimization,
        model: json.model ?? "",
        outputCap: json.max_tokens,
        messageCount: json.messages.length,
        body,
      },
    });
    return res.wwwAuthenticate;
  };

  const fetch = (async (input: string | URL | Request, init?: RequestInit) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const method = init?.method ?? "GET";
    const headers = new Headers(init?.headers);
    const raw = init?.body;
    const body = raw == null ? new Uint8Array() : new Uint8Array(Buffer.from(raw as string));
    if (body.length > 0) lastBody = body;
    const authorization = headers.get("authorization");
    if (!authorization) {
      return new Response(JSON.stringify({ error: { code: "payment_required" } }), {
        status: 402,
        headers: {
          "www-authenticate": await challenge(method, url.pathname, body),
          "cache-control": "no-store",
        },
      });
    }
    try {
      const request = { authorization, httpMethod: method, path: url.pathname, body };
      const [v] = await Promise.all([
        client.verify(request),
        ...(opts.alsoVerifyOn ?? []).map((c) => c.verify(request)),
      ]);
      log.paid.push({ authorization, body, action: v.action });
      if (v.action === Action.TOP_UP) {
        return new Response(null, { status: 204, headers: { "payment-receipt": v.paymentReceipt } });
      }
      if (v.action === Action.CLOSE) {
        const closed = await client.close({ authorization, httpMethod: method, path: url.pathname });
        return new Response(null, { status: 204, headers: { "payment-receipt": closed.paymentReceipt } });
      }
      const { reservationId } = await client.reserve({
        channelId: v.channelId,
        requestId: randomUUID(),
        quote: v.quote,
      });
      const { paymentReceipt } = await client.commit({
        reservationId,
        channelId: v.channelId,
        challengeId: v.challengeId,
        actualCost: actualCost(BigInt(v.quote)).toString(),
      });
      return new Response(
        JSON.stringify({ choices: [{ message: { role: "assistant", content: "Hello." } }] }),
        {
          status: 200,
          headers: { "content-type": "application/json", "payment-receipt": paymentReceipt },
        },
      );
    } catch (err) {
      if (!(err instanceof RemoteError)) throw err;
      const code = err.code ?? "internal";
      log.codes.push(code);
      const challengeBody = body.length > 0 ? body : lastBody;
      return new Response(JSON.stringify({ error: { code, message: err.message } }), {
        status: 402,
        headers: {
          "content-type": "application/json",
          ...(challengeBody
            ? { "www-authenticate": await challenge(method, url.pathname, challengeBody) }
            : {}),
        },
      });
    }
  }) as typeof globalThis.fetch;

  return { fetch, log };
}
