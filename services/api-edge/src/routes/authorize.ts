import type { MessageInitShape } from "@bufbuild/protobuf";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { retrying } from "@tollgate/kit/retry";
import { type AuthorizeRequestSchema, type AuthorizeResponse, Route } from "@tollgate/proto/auth";
import type { CompleteResponse, Usage } from "@tollgate/proto/inference";
import type { FastifyReply, FastifyRequest } from "fastify";
import { callerGone, callerLeft } from "../http/caller.js";
import { bearerKey, type KeyReader } from "../http/credentials.js";
import { type AccountRouteContext, AUTH_TIMEOUT_MS } from "./context.js";
import { msLeft, ticketOf } from "./leases.js";

/** What a model-running route asks auth-policy about. */
export interface AuthorizeAsk {
  route: Route;
  /** Empty: the connection's default model. */
  model?: string;
  maxOutputTokens?: number | undefined;
  /** Messages (chat), prompts (completions) or input items (responses), for the quote. */
  messageCount?: number;
  /**
   * Bytes of input the body does not carry but the upstream gets (the stored items a Responses
   * request refers to), added to the body's for the quote, so it stays an upper bound.
   */
  extraInputBytes?: number;
  /** Output sequences asked of the upstream (`n`/`best_of` × prompts), for the quote. */
  outputSequences?: number;
  /** Check the key and route only, taking nothing (a request refused for its body). */
  checkOnly?: boolean;
  /** The route needs a model that reasons: refused before anything is held. */
  requireReasoning?: boolean;
  /** Where the route reads the Virtual Key; default `Authorization: Bearer`. */
  readKey?: KeyReader;
}

/**
 * Authorizes one account-door request (key, model access, policy, rate limits) and puts the
 * tightest rate-limit window on the response as RateLimit-* header fields. The input estimate
 * for tokens-per-minute limits is a quarter of the input's bytes (the body's and
 * extraInputBytes). A request that runs a model is admitted on this replica's lease for its
 * shape when one covers it (docs/money.md, "Leases"), else authorized by auth-policy on its
 * own; a check only, and the models route, always are.
 */
export async function authorizeRequest(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  ask: AuthorizeAsk,
): Promise<AuthorizeResponse> {
  const inputBytes = (req.rawBody?.length ?? 0) + (ask.extraInputBytes ?? 0);
  const init: MessageInitShape<typeof AuthorizeRequestSchema> = {
    key: (ask.readKey ?? bearerKey)(req.headers),
    route: ask.route,
    model: ask.model ?? "",
    requestId: req.id,
    estimatedInputTokens: Math.ceil(inputBytes / 4),
    bodyBytes: inputBytes,
    ...(ask.messageCount !== undefined ? { messageCount: ask.messageCount } : {}),
    ...(ask.maxOutputTokens !== undefined ? { maxOutputTokens: ask.maxOutputTokens } : {}),
    ...(ask.outputSequences !== undefined && ask.outputSequences > 1
      ? { outputSequences: ask.outputSequences }
      : {}),
    ...(ask.checkOnly ? { checkOnly: true } : {}),
    ...(ask.requireReasoning ? { requireReasoning: true } : {}),
  };
  // One deadline for the whole authorization: when the lease's calls found no answer (auth-policy
  // or its Redis stalled), the request's own Authorize has what is left of it, so a caller waits
  // AUTH_TIMEOUT_MS for its 504 at most, not once per call.
  const deadlineMs = Date.now() + AUTH_TIMEOUT_MS;
  // The models route shows the budget as auth-policy counts it: this replica's idle leases of
  // the key go back first.
  if (ctx.leases && ask.route === Route.MODELS) await ctx.leases.returnIdle(init.key ?? "", deadlineMs);
  const leased =
    ctx.leases && !ask.checkOnly && ask.route !== Route.MODELS
      ? await ctx.leases.admit(init, deadlineMs)
      : undefined;
  const grant = leased ?? (await ctx.auth.authorize(init, { timeoutMs: msLeft(deadlineMs) }));
  // A request that ends without saying how (an error before its call, say) keeps its quote.
  if (leased) reply.raw.once("close", () => ticketOf(leased)?.end("unsure"));
  const limit = grant.rateLimit;
  if (limit && limit.limit > 0) {
    reply.headers({
      "ratelimit-limit": String(limit.limit),
      "ratelimit-remaining": String(limit.remaining),
      "ratelimit-reset": String(limit.resetSeconds),
    });
  }
  const left = budgetLeftOf(grant);
  if (left !== "") {
    // Before the model runs, the worst case: the whole quote is held.
    reply.header("x-tollgate-budget-remaining", left);
  }
  return grant;
}

/**
 * The key and route checked alone, nothing held or counted: the 401 or 403 a full authorization
 * would give, before a request refused for its body, its stored items, or answered from its
 * Idempotency-Key record. Its grant names the caller (the record's scope).
 */
export function checkKeyAndRoute(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  route: Route,
  readKey: KeyReader = bearerKey,
): Promise<AuthorizeResponse> {
  return authorizeRequest(ctx, req, reply, { route, checkOnly: true, readKey });
}

/**
 * What a grant's key may still spend: the least of what is left of its connection's budget and
 * of its own, of those that apply ("" when none does). So x-tollgate-budget-remaining names the
 * budget that refuses first, as a 402 does, whether that is the connection's or the key's.
 */
export function budgetLeftOf(grant: AuthorizeResponse): string {
  const { budgetRemaining: connection, keyBudgetRemaining: key } = grant;
  if (connection === "" || key === "") return connection || key;
  return BigInt(key) < BigInt(connection) ? key : connection;
}

/**
 * The money a buffered success carries (docs/contract.md, "Money"): its cost, and the budget
 * left once it settles (budgetLeftOf): what was left after the hold, plus the hold, minus the
 * actual cost.
 */
export function moneyHeaders(reply: FastifyReply, grant: AuthorizeResponse, cost: string | undefined): void {
  if (cost !== undefined) reply.headers(moneyOf(grant)(cost));
}

/** The money fields of a request once its cost is known: headers, or a stream's trailers. */
export function moneyOf(grant: AuthorizeResponse): (cost: string) => Record<string, string> {
  return (cost) => {
    const fields: Record<string, string> = { "x-tollgate-cost": cost };
    const budgetLeft = budgetLeftOf(grant);
    if (budgetLeft !== "" && grant.quote !== "") {
      const left = BigInt(budgetLeft) + BigInt(grant.quote) - BigInt(cost);
      fields["x-tollgate-budget-remaining"] = left.toString();
    }
    return fields;
  };
}

/**
 * Gives a request's budget hold back at once when it ends before any usage was recorded (the
 * router records none for a call that failed or was cancelled before its first output), instead
 * of letting it count until the reservation TTL: a settlement of zero cost, idempotent by
 * reservation id like every settlement.
 */
export async function releaseHold(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  grant: AuthorizeResponse,
): Promise<void> {
  const ticket = ticketOf(grant);
  if (ticket) return ticket.end("released");
  if (grant.reservationId === "") return;
  const release = () =>
    ctx.auth.settleReservation(
      { reservationId: grant.reservationId, actualCost: "0", eventId: `release_${grant.reservationId}` },
      { timeoutMs: AUTH_TIMEOUT_MS },
    );
  try {
    await release();
  } catch (err) {
    if (!unavailable(err)) {
      req.log.warn({ err }, "budget hold not released; it lapses with its TTL");
      return;
    }
    // auth-policy or its Redis is briefly away (a restart): keep trying in the background, so
    // the caller's error is not delayed and the hold does not linger until its TTL.
    void retrying(release, unavailable, RELEASE_RETRY).catch((lastErr: unknown) =>
      req.log.warn({ err: lastErr }, "budget hold not released; it lapses with its TTL"),
    );
  }
}

/** How a release that met auth-policy away is tried again. */
const RELEASE_RETRY = { delayMs: 500, forMs: 30_000 };

const unavailable = (err: unknown) => err instanceof RemoteError && err.status === GrpcStatus.UNAVAILABLE;

/**
 * Runs a buffered completion. When it fails, the budget hold goes back before the error does;
 * when it succeeds, the hold becomes the request's exact cost before the answer is sent.
 */
export async function completeOrRelease(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  grant: AuthorizeResponse,
  call: (signal: AbortSignal) => Promise<CompleteResponse>,
): Promise<CompleteResponse> {
  const signal = callerGone(reply);
  await releaseIfGone(ctx, req, grant, signal);
  let res: CompleteResponse;
  try {
    res = await call(signal);
  } catch (err) {
    await releaseOnFailure(ctx, req, grant)(err);
    throw err;
  }
  await settleHold(ctx, req, grant, res.usage);
  return res;
}

/**
 * A caller that left before its model's call started (while its key was checked and its budget
 * held): no model runs, and its hold goes back at once, since nothing can have used it. A call
 * cancelled once started is unsure instead (failedBeforeUsage), and its hold left to metering.
 */
export async function releaseIfGone(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  grant: AuthorizeResponse,
  signal: AbortSignal,
): Promise<void> {
  if (!signal.aborted) return;
  await releaseHold(ctx, req, grant);
  throw callerLeft();
}

/**
 * Turns a request's budget hold into its exact cost as soon as the cost is known (the answer is
 * complete), so the next request of a caller sending one at a time sees what is really left,
 * not the whole quote until metering catches up (docs/money.md, "Holds"). The settlement names
 * the router's usage event, and settling is idempotent by reservation id: metering's own
 * settlement of that event later finds it done at the same cost, and stays the record of spend.
 * When this fails, metering's settlement does it. A request admitted on a lease settles in this
 * replica only: the rest of its quote goes back to the lease, and metering's settlement of its
 * usage event is the one commit of its cost (docs/money.md, "Leases").
 */
export async function settleHold(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  grant: AuthorizeResponse,
  usage: Usage | undefined,
): Promise<void> {
  const ticket = ticketOf(grant);
  if (ticket) return ticket.end(usage && usage.cost !== "" ? { cost: BigInt(usage.cost) } : "unsure");
  if (grant.reservationId === "" || !usage || usage.eventId === "") return;
  try {
    await ctx.auth.settleReservation(
      { reservationId: grant.reservationId, actualCost: usage.cost, eventId: usage.eventId },
      { timeoutMs: AUTH_TIMEOUT_MS },
    );
  } catch (err) {
    req.log.warn({ err }, "budget hold not settled at once; metering settles it");
  }
}

/** What to do with a failed call's hold: give it back when the call certainly recorded no usage. */
export function releaseOnFailure(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  grant: AuthorizeResponse,
): (err: unknown) => Promise<void> {
  return async (err) => {
    if (failedBeforeUsage(err)) await releaseHold(ctx, req, grant);
    else ticketOf(grant)?.end("unsure");
  };
}

/**
 * Whether a failed call certainly recorded no usage: the router answered with an error of its
 * own. A cancelled call (the caller went away) may have finished upstream and published its
 * usage, and `usage_not_recorded` may hide a publish that was stored after all: their holds are
 * left to metering's settlement or the TTL, so a late settlement is never refused.
 */
export function failedBeforeUsage(err: unknown): boolean {
  return (
    err instanceof RemoteError && err.status !== GrpcStatus.CANCELLED && err.code !== "usage_not_recorded"
  );
}
