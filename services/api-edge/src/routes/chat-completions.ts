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
      const body = await parseAccountBody(ctx, req, reply, OPERATIONS[operation], ctx.schemas[schema]);
      const grant = await authorizeRequest(ctx, req, reply, {
        route: OPERATIONS[operation],
        model: body.model ?? "",
        maxOutputTokens: outputCapOf(body),
        messageCount: body.messages.length,
        outputSequences: outputSequencesOf(body),
      });
      if (await guardIdempotency(ctx, req, reply, grant, operation, body.stream === true)) return reply;
      const input = completionInput(req, grant, Operation.CHAT, req.rawBody!);
      const stream = body.stream ? { includeUsage: body.stream_options?.include_usage === true } : undefined;
      return serveCompletion(ctx, req, reply, grant, input, stream);
    },
  };
}
