import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { inputCountOf } from "../schemas/embeddings.js";
import { completionInput, guardIdempotency, parseAccountBody } from "./account-inference.js";
import { authorizeRequest, completeOrRelease, moneyHeaders } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.embeddings;

/**
 * POST /v1/embeddings: OpenAI's embeddings (docs/account-door.md, "Routes"), buffered. Nothing is
 * generated, so the output cap is 0 and the quote is the input bound alone; the hold is settled
 * to the input tokens the upstream reports (never above the quote). auth-policy refuses a model
 * that is not an embedding model before anything is counted or held (the router checks again);
 * the router sends the body to the upstream's /v1/embeddings.
 */
export function embeddingsRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const route = OPERATIONS[operation];
      const body = await parseAccountBody(ctx, req, reply, route, ctx.schemas[schema]);
      if (await guardIdempotency(ctx, req, reply, { route, scope: operation, streaming: false }))
        return reply;
      const grant = await authorizeRequest(ctx, req, reply, {
        route,
        model: body.model,
        maxOutputTokens: 0,
        messageCount: inputCountOf(body),
      });
      const input = completionInput(req, grant, Operation.EMBEDDINGS, req.rawBody!);
      const res = await completeOrRelease(ctx, req, reply, grant, (signal) =>
        ctx.inference.complete({ input }, { signal }),
      );
      moneyHeaders(reply, grant, res.usage?.cost);
      // The router answers OpenAI's list as the caller gets it (vectors in input order, the
      // public model id, the billed input tokens as usage): its bytes pass through unparsed.
      return reply.type("application/json").send(Buffer.from(res.body));
    },
  };
}
