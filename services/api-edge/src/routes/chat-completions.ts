import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { outputCapOf, outputSequencesOf } from "../schemas/chat.js";
import { completionInput, guardIdempotency, parseAccountBody, serveCompletion } from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.chat;

/** POST /v1/chat/completions: the account door's chat route, buffered or streamed (docs/contract.md). */
export function chatCompletionsRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const route = OPERATIONS[operation];
      const body = await parseAccountBody(ctx, req, reply, route, ctx.schemas[schema]);
      const streaming = body.stream === true;
      if (await guardIdempotency(ctx, req, reply, { route, scope: operation, streaming })) return reply;
      const grant = await authorizeRequest(ctx, req, reply, {
        route,
        model: body.model ?? "",
        maxOutputTokens: outputCapOf(body),
        messageCount: body.messages.length,
        outputSequences: outputSequencesOf(body),
      });
      const input = completionInput(req, grant, Operation.CHAT, req.rawBody!);
      const stream = body.stream ? { includeUsage: body.stream_options?.include_usage === true } : undefined;
      return serveCompletion(ctx, req, reply, grant, input, stream);
    },
  };
}
