import { Route } from "@tollgate/proto/auth";
import { Operation } from "@tollgate/proto/inference";
import type { FastifyInstance } from "fastify";
import { callerGone } from "../http/caller.js";
import { relayStream } from "../http/sse.js";
import { chatRequestSchema, outputCapOf } from "../schemas/chat.js";
import { completionInput, idempotencyScope, parseAccountBody } from "./account-inference.js";
import { authorizeRequest, completeOrRelease, moneyHeaders, moneyOf, releaseOnFailure } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";

/** POST /v1/chat/completions: the account door's chat route, buffered or streamed (spec, "Endpoints"). */
export function chatCompletionsRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.post("/v1/chat/completions", async (req, reply) => {
    const body = await parseAccountBody(ctx, req, reply, Route.CHAT_COMPLETIONS, chatRequestSchema);
    const grant = await authorizeRequest(ctx, req, reply, {
      route: Route.CHAT_COMPLETIONS,
      model: body.model ?? "",
      maxOutputTokens: outputCapOf(body),
      messageCount: body.messages.length,
    });
    if (await ctx.idempotency.guard(req, reply, idempotencyScope(grant, "chat"), body.stream === true))
      return reply;
    const input = completionInput(req, grant, Operation.CHAT, req.rawBody!);
    if (body.stream) {
      const signal = callerGone(reply);
      const includeUsage = body.stream_options?.include_usage === true;
      return relayStream(
        req,
        reply,
        ctx.inference.streamComplete({ input, includeUsage }, { signal }),
        signal,
        moneyOf(grant),
        releaseOnFailure(ctx, req, grant),
      );
    }

    const res = await completeOrRelease(ctx, req, grant, () =>
      ctx.inference.complete({ input }, { signal: callerGone(reply) }),
    );
    moneyHeaders(reply, grant, res.usage?.cost);
    return reply.type("application/json").send(Buffer.from(res.body));
  });
}
