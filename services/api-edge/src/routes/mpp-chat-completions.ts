import { randomUUID } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ErrorCode } from "@tollgate/proto/errors";
import { Door, Operation } from "@tollgate/proto/inference";
import { Action, type PaidRequestSchema } from "@tollgate/proto/payment";
import { ROUTES } from "@tollgate/proto/routes";
import type { FastifyReply, FastifyRequest } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { callerGone, callerLeft } from "../http/caller.js";
import { hasKeyField } from "../http/credentials.js";
import { type HttpError, httpErrorOf, problemBody, toHttpError } from "../http/errors.js";
import { bodyRefusal } from "../http/json-body.js";
import { outputCapOf, outputSequencesOf, type PaidChatRequest } from "../schemas/chat.js";
import type { RequestSchemas } from "../schemas/requests.js";
import { describeInvalid } from "./account-inference.js";
import type { RouteContext } from "./context.js";
import { chargeOf, onAnyReplica, receiptWithCharge } from "./paid-commit.js";
import type { RouteImpl } from "./register.js";

const PATH = ROUTES.mppChat.path;
/**
 * 402s whose caller action the contract gives as "Stop" (docs/contract.md, "Errors"): no fresh
 * challenge rides along, so a client does not retry (or top up) for a request that can never be
 * paid as sent (docs/decisions/0003-digest-mismatch-402.md).
 */
const STOP_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>(["mpp_body_digest_mismatch"]);
const PAYMENT_TIMEOUT_MS = 30_000;

type Credential = { kind: "none" } | { kind: "payment"; header: string };

/**
 * The receipt of the credential mpp-payment accepted for a request that pays for content
 * (spend before the request, nothing charged), kept for the error handler: an error answered
 * after the credential was accepted carries it, so the payer's client keeps the channel (mppx
 * 0.11's session manager drops a channel it just opened when a non-2xx answer has no receipt).
 */
const acceptedReceipts = new WeakMap<FastifyRequest, string>();

/**
 * The paid door accepts only `Authorization: Payment` (docs/contract.md, "Authentication",
 * rules 2 and 3): a Virtual Key (in any field, beside a credential too) or any other scheme here
 * is a 401.
 */
function paymentCredential(req: FastifyRequest): Credential {
  // A Virtual Key is refused here even beside a payment credential: the doors never mix.
  if (hasKeyField(req.headers)) {
    throw new EdgeError(
      "wrong_auth_scheme",
      "Virtual Keys belong to the account routes; this route takes payment",
    );
  }
  const auth = req.headers.authorization;
  if (auth === undefined || auth.trim() === "") return { kind: "none" };
  // A Bearer credential (a Virtual Key) anywhere in the header is refused, beside Payment too.
  if (/(^|,)\s*bearer(\s|,|$)/i.test(auth)) {
    throw new EdgeError(
      "wrong_auth_scheme",
      "Virtual Keys belong to the account routes; this route takes Authorization: Payment",
    );
  }
  // The Payment scheme may stand among other schemes in one header (MPP lets a client send it
  // alongside others). With or without a credential after it, mpp-payment judges it: a bare
  // scheme is a missing credential (mpp_malformed_credential), not a wrong scheme.
  if (/(^|,)\s*payment(\s|,|$)/i.test(auth)) return { kind: "payment", header: auth };
  throw new EdgeError("wrong_auth_scheme", "this route takes Authorization: Payment");
}

function paidRequestOf(
  req: FastifyRequest,
  body: PaidChatRequest,
): MessageInitShape<typeof PaidRequestSchema> {
  return {
    httpMethod: "POST",
    path: PATH,
    plan: body.plan,
    modelOptimization: body.model_optimization,
    model: body.model ?? "",
    outputCap: outputCapOf(body) ?? 0,
    messageCount: body.messages.length,
    outputSequences: outputSequencesOf(body),
    body: req.rawBody ?? new Uint8Array(),
  };
}

/** Validates the body; unpaid and paid requests obey the same rules. */
function validate(req: FastifyRequest, schemas: RequestSchemas): PaidChatRequest {
  const raw = req.body as { stream?: unknown } | undefined;
  if (raw && typeof raw === "object" && raw.stream === true) {
    throw new EdgeError(
      "mpp_streaming_unavailable",
      "streaming is not available on the paid route; send stream: false",
    );
  }
  const parsed = schemas[ROUTES.mppChat.schema].safeParse(req.body);
  if (!parsed.success) throw new EdgeError("invalid_request", describeInvalid(parsed.error.issues));
  return parsed.data;
}

/**
 * POST /v1/mpp/chat/completions: 402 with a challenge when unpaid; with a session credential,
 * verify and reserve (one call) → buffered inference → the answer with the hold's receipt plus
 * the request's charge, its Commit sent as the answer goes (docs/paid-door.md, "One round trip"). HEAD is reserved for later rollouts and never runs a model (docs/contract.md, "The paid
 * door"): like every method the route table does not give this path, registerRoutes answers it 405.
 */
export function mppChatCompletionsRoute(ctx: RouteContext): RouteImpl {
  return {
    errorHandler: paidErrorHandler(ctx),
    handler: async (req, reply) => {
      const credential = paymentCredential(req);
      // A body that could not be read is refused before anything is verified or held.
      const unread = bodyRefusal(req);
      if (unread) throw unread;
      const bodyless = (req.rawBody?.length ?? 0) === 0;
      if (credential.kind === "none") {
        const body = validate(req, ctx.schemas);
        const challenge = await ctx.payment.challenge(
          { request: paidRequestOf(req, body) },
          { timeoutMs: PAYMENT_TIMEOUT_MS },
        );
        const e = httpErrorOf(
          "payment_required",
          "this route is paid per request: retry the identical body with Authorization: Payment",
        );
        return sendProblem(reply, req, e, challenge.wwwAuthenticate, challenge.challengeId);
      }

      const verifying = ctx.payment.verify(
        {
          authorization: credential.header,
          httpMethod: "POST",
          path: PATH,
          body: req.rawBody ?? new Uint8Array(),
          // A credential paying for content is reserved in the same call (one round trip fewer).
          // The hold is named by a fresh id of this HTTP request, never by anything the caller
          // sent (its X-Request-Id is not unique): requests never share a hold, commit or receipt.
          reserveRequestId: randomUUID(),
        },
        { timeoutMs: PAYMENT_TIMEOUT_MS },
      );
      // The body's checks run while mpp-payment verifies; their verdict counts only after it, as
      // if they ran then: a refused credential answers first, and an invalid body after an
      // accepted one gives its hold back (below). A bodyless (management) request has none.
      let body: PaidChatRequest | undefined;
      let invalid: unknown;
      if (!bodyless) {
        try {
          body = validate(req, ctx.schemas);
        } catch (err) {
          invalid = err;
        }
      }
      const verified = await verifying;
      if (verified.acceptedReceipt !== "") acceptedReceipts.set(req, verified.acceptedReceipt);
      // A close is bodyless (docs/contract.md, "Payment sessions"): one sent with a body is
      // refused before it is sent on to Close.
      if (verified.action === Action.CLOSE && !bodyless) {
        throw new EdgeError("invalid_request", "a close credential is sent with no body");
      }
      // Management credentials (topUp, close, or a bodyless open/voucher) never reach a model.
      if (bodyless || verified.action === Action.TOP_UP || verified.action === Action.CLOSE) {
        let receipt = verified.paymentReceipt;
        if (verified.action === Action.CLOSE && receipt === "") {
          receipt = (
            await ctx.payment.close(
              { authorization: credential.header, httpMethod: "POST", path: PATH },
              { timeoutMs: PAYMENT_TIMEOUT_MS },
            )
          ).paymentReceipt;
        }
        if (receipt === "")
          throw new EdgeError("invalid_request", "a management credential needs no body; content needs one");
        return reply.code(204).header("payment-receipt", receipt).header("cache-control", "private").send();
      }

      const binding = verified.binding;
      // No hold from Verify: mpp-payment could not take it (Reserve now says why, or takes it), or
      // it predates reserve_request_id (a rolling upgrade). A new id: a hold Verify took while its
      // reply was lost is given back by mpp-payment, and must not be this one.
      const held =
        verified.reservationId !== ""
          ? { reservationId: verified.reservationId, reservedReceipt: verified.reservedReceipt }
          : await ctx.payment.reserve(
              {
                channelId: verified.channelId,
                requestId: randomUUID(),
                quote: verified.quote,
                challengeId: verified.challengeId,
              },
              { timeoutMs: PAYMENT_TIMEOUT_MS },
            );
      const { reservationId } = held;
      let result: Awaited<ReturnType<RouteContext["inference"]["complete"]>>;
      try {
        if (body === undefined) throw invalid;
        // A caller gone while its payment was verified gets no model (docs/money.md).
        const signal = callerGone(reply);
        if (signal.aborted) {
          throw callerLeft();
        }
        result = await ctx.inference.complete(
          {
            input: {
              requestId: req.id,
              operation: Operation.CHAT,
              model: binding?.model ?? body.model ?? "",
              ...(binding?.outputCap ? { maxOutputTokens: binding.outputCap } : {}),
              body: req.rawBody!,
              // The channel rides into the usage event: metering commits the hold from it too,
              // should this process die before its own Commit lands (docs/money.md).
              billing: {
                door: Door.PAID,
                reservationId,
                quote: verified.quote,
                channelId: verified.channelId,
              },
            },
          },
          { signal },
        );
      } catch (err) {
        // Nothing was served (a body that fails validation included): the hold goes back and no
        // receipt is sent.
        await onAnyReplica(() =>
          ctx.payment.release(
            { reservationId, channelId: verified.channelId },
            { timeoutMs: PAYMENT_TIMEOUT_MS },
          ),
        ).catch((releaseErr: unknown) => req.log.error({ err: releaseErr }, "hold release failed"));
        throw err;
      }
      const charge = chargeOf(result.usage?.cost, verified.quote);
      const commit = () =>
        ctx.payment.commit(
          {
            reservationId,
            channelId: verified.channelId,
            challengeId: verified.challengeId,
            actualCost: charge.toString(),
          },
          { timeoutMs: PAYMENT_TIMEOUT_MS },
        );
      // One round trip (docs/paid-door.md): the receipt is the hold's plus this request's charge,
      // and Commit leaves for mpp-payment as the answer does, retried there on any replica; a
      // close waits for it. A hold without its receipt (a replica that predates it) is committed
      // first, as before.
      let receipt = receiptWithCharge(held.reservedReceipt, charge, new Date());
      if (receipt !== undefined) {
        ctx.paidCommits.send(commit, req.log, reservationId);
      } else {
        // A commit whose replica died mid-call may or may not have run: the retry on another
        // replica commits it, or answers the first commit's figures (idempotent by reservation id).
        receipt = await onAnyReplica(commit).then(
          (c) => c.paymentReceipt,
          (err: unknown) => {
            req.log.error({ err }, "paid usage commit failed");
            return "";
          },
        );
      }
      // A 200 without Payment-Receipt never happens (docs/contract.md, "The paid door", rule 5):
      // no commit, no content.
      if (receipt === "") {
        throw new EdgeError(
          "mpp_commit_failed",
          "the paid usage could not be committed; no receipt was issued",
        );
      }
      if (result.usage) reply.header("x-tollgate-cost", charge.toString());
      return reply
        .header("payment-receipt", receipt)
        .header("cache-control", "private")
        .type("application/json")
        .send(Buffer.from(result.body));
    },
  };
}

function sendProblem(
  reply: FastifyReply,
  req: FastifyRequest,
  e: HttpError,
  wwwAuthenticate?: string,
  challengeId?: string,
) {
  if (wwwAuthenticate) reply.header("www-authenticate", wwwAuthenticate);
  // Retry-After when every upstream of the model is cooled down, as on the account door.
  if (e.headers) reply.headers(e.headers);
  return reply
    .code(e.status)
    .header("cache-control", "no-store")
    .type("application/problem+json")
    .send(problemBody(e, req.id, challengeId));
}

/**
 * Errors of the paid route: problem details, and a fresh challenge on every 402 so the
 * client can pay or re-sign (a 402 without one leaves the mppx client nothing to pay or sign),
 * when the body is valid enough to bind one and the code is not a STOP_CODES one. Any other
 * error answered after mpp-payment accepted the request's open or voucher carries that
 * credential's receipt (nothing charged): the payer keeps the channel it funded. A 402 does not:
 * it asks the client to pay again, with the fresh challenge.
 */
function paidErrorHandler(ctx: RouteContext) {
  return async (err: unknown, req: FastifyRequest, reply: FastifyReply) => {
    const e = toHttpError(err, req.log);
    const accepted = acceptedReceipts.get(req);
    if (e.status !== 402 && accepted !== undefined) reply.header("payment-receipt", accepted);
    if (e.status !== 402 || STOP_CODES.has(e.code)) return sendProblem(reply, req, e);
    try {
      const body = validate(req, ctx.schemas);
      const challenge = await ctx.payment.challenge(
        { request: paidRequestOf(req, body) },
        { timeoutMs: PAYMENT_TIMEOUT_MS },
      );
      return sendProblem(reply, req, e, challenge.wwwAuthenticate, challenge.challengeId);
    } catch {
      return sendProblem(reply, req, e);
    }
  };
}
