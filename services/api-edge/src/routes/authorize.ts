import type { MessageInitShape } from "@bufbuild/protobuf";
import type { AuthorizeRequestSchema, AuthorizeResponse, Route } from "@tollgate/proto/auth";
import type { FastifyReply, FastifyRequest } from "fastify";
import { bearerKey } from "../http/credentials.js";
import { type AccountRouteContext, AUTH_TIMEOUT_MS } from "./context.js";

/** What a model-running route asks auth-policy about. */
export interface AuthorizeAsk {
  route: Route;
  /** Empty: the connection's default model. */
  model?: string;
  maxOutputTokens?: number | undefined;
}

/**
 * Authorizes one account-door request (key, model access, policy, rate limits) and puts the
 * tightest rate-limit window on the response as RateLimit-* header fields. The input estimate
 * for tokens-per-minute limits is a quarter of the body's bytes.
 */
export async function authorizeRequest(
  ctx: AccountRouteContext,
  req: FastifyRequest,
  reply: FastifyReply,
  ask: AuthorizeAsk,
): Promise<AuthorizeResponse> {
  const init: MessageInitShape<typeof AuthorizeRequestSchema> = {
    key: bearerKey(req.headers),
    route: ask.route,
    model: ask.model ?? "",
    requestId: req.id,
    estimatedInputTokens: Math.ceil((req.rawBody?.length ?? 0) / 4),
    ...(ask.maxOutputTokens !== undefined ? { maxOutputTokens: ask.maxOutputTokens } : {}),
  };
  const grant = await ctx.auth.authorize(init, { timeoutMs: AUTH_TIMEOUT_MS });
  const limit = grant.rateLimit;
  if (limit && limit.limit > 0) {
    reply.headers({
      "ratelimit-limit": String(limit.limit),
      "ratelimit-remaining": String(limit.remaining),
      "ratelimit-reset": String(limit.resetSeconds),
    });
  }
  return grant;
}
