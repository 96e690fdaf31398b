import type { MessageInitShape } from "@bufbuild/protobuf";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { randomHex } from "@tollgate/kit/ids";
import type { AuthorizeResponse, Route } from "@tollgate/proto/auth";
import { type CompletionInputSchema, Door, type Operation, type Usage } from "@tollgate/proto/inference";
import type { UsageRecorded } from "@tollgate/proto/usage";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { z } from "zod";
import { type ChatAnswer, readChatAnswer, type TokenUsage } from "../domain/chat-answer.js";
import { EdgeError } from "../domain/errors.js";
import { callerGone } from "../http/caller.js";
import { bearerKey, type KeyReader } from "../http/credentials.js";
import { bodyRefusal } from "../http/json-body.js";
import { relayStream, type StreamFormat } from "../http/sse.js";
import {
  checkKeyAndRoute,
  completeOrRelease,
  moneyHeaders,
  moneyOf,
  releaseIfGone,
  releaseOnFailure,
  settleHold,
} from "./authorize.js";
import { type AccountRouteContext, RECORD_USAGE_TIMEOUT_MS } from "./context.js";
import { ticketOf } from "./leases.js";

/** Readable one-line description of the first validation problems. */
export function describeInvalid(issues: ReadonlyArray<{ path: PropertyKey[]; message: string }>): string {
  return issues
    .slice(0, 3)
    .map((i) => `${i.path.map(String).join(".") || "body"}: ${i.message}`)
    .join("; ");
}

/**
 * Validates an account-door request: its body, and an Idempotency-Key it cannot use. The key is
 * checked first, so a bad key gets its 401 (and a route outside policy its 403) whatever the
 * request holds; otherwise the refusal is a 400. That check takes nothing: a refused request
 * holds no budget and counts no rate-limit unit (docs/money.md, "Holds").
 */
export async function parseAccountBody<S extends z.ZodType>(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  route: Route,
  schema: S,
  readKey: KeyReader = bearerKey,
): Promise<z.output<S>> {
  readKey(req.headers);
  let refused = bodyRefusal(req);
  if (refused === undefined) {
    const parsed = schema.safeParse(req.body);
    if (!parsed.success) refused = new EdgeError("invalid_request", describeInvalid(parsed.error.issues));
    else {
      refused = ctx.idempotency.refusal(req, (parsed.data as { stream?: unknown }).stream === true);
      if (!refused) return parsed.data as z.output<S>;
    }
  }
  await checkKeyAndRoute(ctx, req, reply, route, readKey);
  throw refused;
}

/** The Idempotency-Key scope of a route: one caller's keys never meet another's or another route's. */
export function idempotencyScope(grant: AuthorizeResponse, route: string): string {
  return `${grant.principal?.accountId}:${grant.principal?.keyId}:${route}`;
}

/**
 * Idempotency-Key handling (Idempotency.guard), before anything is held or counted: the key and
 * route are checked alone (a revoked key still gets its 401, a route outside policy its 403),
 * then the stored answer is replayed, a reuse with another body refused (422) or a running
 * duplicate waited for. A replay spends and counts nothing, so it is the stored answer whatever
 * the budget or a rate limit would say of the request now (docs/contract.md, "Idempotency"):
 * a caller retrying an answer it was charged for but never read gets it. Only the request that
 * runs is authorized with a hold, after this; its claim goes if that refuses it. True when a
 * stored response was sent.
 */
export async function guardIdempotency(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  ask: { route: Route; scope: string; streaming: boolean; readKey?: KeyReader },
): Promise<boolean> {
  if (req.headers["idempotency-key"] === undefined) return false;
  const checked = await checkKeyAndRoute(ctx, req, reply, ask.route, ask.readKey);
  return ctx.idempotency.guard(req, reply, idempotencyScope(checked, ask.scope), ask.streaming);
}

/** The router's input for an authorized request: the grant's model, cap and billing, and the body to forward. */
export function completionInput(
  req: FastifyRequest,
  grant: AuthorizeResponse,
  operation: Operation,
  body: Uint8Array,
  opts: { requireReasoning?: boolean } = {},
): MessageInitShape<typeof CompletionInputSchema> {
  return {
    requestId: req.id,
    operation,
    model: grant.model,
    ...(grant.maxOutputTokens !== undefined ? { maxOutputTokens: grant.maxOutputTokens } : {}),
    body,
    billing: {
      door: Door.ACCOUNT,
      accountId: grant.principal?.accountId ?? "",
      connectionId: grant.principal?.connectionId ?? "",
      keyId: grant.principal?.keyId ?? "",
      reservationId: grant.reservationId,
      quote: grant.quote,
    },
    ...(opts.requireReasoning ? { requireReasoning: true } : {}),
  };
}

/** A fresh object id with OpenAI's prefix style ("resp_…", "msg_…"). */
export function objectId(prefix: string): string {
  return `${prefix}_${randomHex(16)}`;
}

/**
 * Runs an authorized chat completion buffered for a route that answers in its own shape
 * (responses, messages, think): the money headers are set and the chat answer is read back for
 * the route to translate.
 */
export async function completeChat(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  grant: AuthorizeResponse,
  input: MessageInitShape<typeof CompletionInputSchema>,
): Promise<{ answer: ChatAnswer; usage: TokenUsage }> {
  const res = await completeOrRelease(ctx, req, reply, grant, (signal) =>
    ctx.inference.complete({ input }, { signal }),
  );
  moneyHeaders(reply, grant, res.usage?.cost);
  return chatResultOf(res);
}

/** Unix seconds now. */
export const unixNow = () => Math.floor(Date.now() / 1000);

/** The router's answer to a translated chat request: the chat answer and the billed token counts. */
export function chatResultOf(res: { body: Uint8Array; usage?: Usage | undefined }): {
  answer: ChatAnswer;
  usage: TokenUsage;
} {
  return {
    answer: readChatAnswer(JSON.parse(Buffer.from(res.body).toString("utf8"))),
    usage: {
      inputTokens: res.usage?.inputTokens ?? 0,
      outputTokens: res.usage?.outputTokens ?? 0,
      reasoningTokens: res.usage?.reasoningTokens ?? 0,
    },
  };
}

/**
 * Records the usage of a stream whose router was lost mid-stream (killed, restarted): what was
 * relayed to the caller, priced by the router, under the router's event id, so it is billed
 * once whether or not the router published it. True once metering stored it; a failure leaves
 * the hold to its TTL.
 */
async function recordLostStream(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  usage: UsageRecorded,
): Promise<boolean> {
  if (!ctx.metering) {
    req.log.warn("stream lost mid-way and no metering to record it; the hold lapses with its TTL");
    return false;
  }
  return ctx.metering.recordUsage({ usage }, { timeoutMs: RECORD_USAGE_TIMEOUT_MS }).then(
    () => {
      req.log.info("usage of a stream lost mid-way recorded");
      return true;
    },
    (err: unknown) => {
      req.log.error({ err }, "usage of a stream lost mid-way not recorded");
      return false;
    },
  );
}

/**
 * Whether a stream's failure is the router's own answer after it published the stream's usage:
 * a router that fails a started stream (its upstream died) publishes the usage of what it
 * relayed before answering its error, and answers `usage_not_recorded` instead when that
 * publish failed. A router lost mid-way (killed, unreachable) answers nothing of its own.
 */
function recordedByRouter(err: unknown): boolean {
  return (
    err instanceof RemoteError &&
    err.code !== undefined &&
    err.code !== "usage_not_recorded" &&
    err.status !== GrpcStatus.CANCELLED
  );
}

/**
 * Streams an authorized completion to the caller as SSE in `format` (default: the OpenAI chunks
 * as the router sends them). The stream is billed the same whatever its format: settled with its
 * usage when it finishes, its hold given back when it fails before any usage, and what was
 * relayed recorded when its router is lost mid-stream; whenever what was relayed is billed, the
 * caller is told its cost as a finished stream is (trailers, `x_tollgate` on the final event).
 */
export async function streamCompletion(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  grant: AuthorizeResponse,
  input: MessageInitShape<typeof CompletionInputSchema>,
  opts: { includeUsage: boolean; format?: StreamFormat },
): Promise<FastifyReply> {
  const signal = callerGone(reply);
  await releaseIfGone(ctx, req, grant, signal);
  return relayStream(
    req,
    reply,
    ctx.inference.streamComplete({ input, includeUsage: opts.includeUsage }, { signal }),
    signal,
    async (usage) => {
      await settleHold(ctx, req, grant, usage);
      return moneyOf(grant)(usage.cost);
    },
    releaseOnFailure(ctx, req, grant),
    async (usage, err) => {
      // What was relayed is what is billed: the rest of a lease's quote goes back.
      ticketOf(grant)?.end({ cost: BigInt(usage.cost || "0") });
      const recorded = await recordLostStream(ctx, req, usage);
      // The caller is told the charge of the event metering applies (the same id and cost,
      // whoever stored it), as a finished stream is told its own (docs/money.md, "Records").
      return recorded || recordedByRouter(err) ? moneyOf(grant)(usage.cost || "0") : undefined;
    },
    opts.format,
  );
}

/**
 * Serves an authorized chat or text completion: relayed as SSE when streamed, else buffered
 * with its money headers. Either way a failure before any usage gives the budget hold back.
 */
export async function serveCompletion(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  grant: AuthorizeResponse,
  input: MessageInitShape<typeof CompletionInputSchema>,
  stream: { includeUsage: boolean } | undefined,
): Promise<FastifyReply> {
  if (stream) return streamCompletion(ctx, req, reply, grant, input, stream);
  const res = await completeOrRelease(ctx, req, reply, grant, (signal) =>
    ctx.inference.complete({ input }, { signal }),
  );
  moneyHeaders(reply, grant, res.usage?.cost);
  return reply.type("application/json").send(Buffer.from(res.body));
}
