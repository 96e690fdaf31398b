import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { outputCapOf, outputSequencesOf } from "../schemas/chat.js";
import { promptCountOf } from "../schemas/completions.js";
import { completionInput, guardIdempotency, parseAccountBody, serveCompletion } from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.completions;

/**
 * POST /v1/completions: OpenAI's legacy text completion (docs/contract.md, "The two doors"),
 * buffered or streamed. The caller's body is forwarded as received; the router sends it to the
 * upstream's /v1/completions with the model and output cap rewritten.
 */
export function completionsRoute(ctx: AccountRouteContext): RouteImpl {
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
        messageCount: promptCountOf(body),
        outputSequences: outputSequencesOf(body, promptCountOf(body)),
      });
      const input = completionInput(req, grant, Operation.TEXT, req.rawBody!);
      const stream = body.stream ? { includeUsage: body.stream_options?.include_usage === true } : undefined;
      return serveCompletion(ctx, req, reply, grant, input, stream);
    },
  };
}
