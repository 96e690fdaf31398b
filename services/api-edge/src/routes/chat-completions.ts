import { Route } from "@tollgate/proto/auth";
import { Operation } from "@tollgate/proto/inference";
import type { FastifyInstance } from "fastify";
import { outputCapOf, outputSequencesOf } from "../schemas/chat.js";
import { completionInput, guardIdempotency, parseAccountBody, serveCompletion } from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";

/** POST /v1/chat/completions: the account door's chat route, buffered or streamed (docs/contract.md). */
export function chatCompletionsRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.post("/v1/chat/completions", async (req, reply) => {
    const body = await parseAccountBody(ctx, req, reply, Route.CHAT_COMPLETIONS, ctx.schemas.chat);
    const grant = await authorizeRequest(ctx, req, reply, {
      route: Route.CHAT_COMPLETIONS,
      model: body.model ?? "",
      maxOutputTokens: outputCapOf(body),
      messageCount: body.messages.length,
      outputSequences: outputSequencesOf(body),
    });
    if (await guardIdempotency(ctx, req, reply, grant, "chat", body.stream === true)) return reply;
    const input = completionInput(req, grant, Operation.CHAT, req.rawBody!);
    const stream = body.stream ? { includeUsage: body.stream_options?.include_usage === true } : undefined;
    return serveCompletion(ctx, req, reply, grant, input, stream);
  });
}
