import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { chatBodyFromResponses, responseFromChat } from "../domain/responses.js";
import { callerGone } from "../http/caller.js";
import {
  chatResultOf,
  completionInput,
  guardIdempotency,
  objectId,
  parseAccountBody,
  unixNow,
} from "./account-inference.js";
import { authorizeRequest, completeOrRelease, moneyHeaders } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.responses;

/**
 * POST /v1/responses: the buffered text subset of the Responses API. The request is translated
 * to a chat request (these bytes are what the router forwards and counts), the chat answer back
 * to a `response` object. `stream: true` is refused by the schema with a clear message.
 */
export function responsesRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const body = await parseAccountBody(ctx, req, reply, OPERATIONS[operation], ctx.schemas[schema]);
      const grant = await authorizeRequest(ctx, req, reply, {
        route: OPERATIONS[operation],
        model: body.model ?? "",
        maxOutputTokens: body.max_output_tokens ?? undefined,
        messageCount: (typeof body.input === "string" ? 1 : body.input.length) + (body.instructions ? 1 : 0),
      });
      if (await guardIdempotency(ctx, req, reply, grant, operation, false)) return reply;
      const chat = chatBodyFromResponses(body, grant.model, grant.maxOutputTokens);
      const input = completionInput(req, grant, Operation.CHAT, Buffer.from(JSON.stringify(chat)));
      const res = await completeOrRelease(ctx, req, grant, () =>
        ctx.inference.complete({ input }, { signal: callerGone(reply) }),
      );
      moneyHeaders(reply, grant, res.usage?.cost);
      const { answer, usage } = chatResultOf(res);
      return responseFromChat(body, answer, usage, {
        id: objectId("resp"),
        messageId: objectId("msg"),
        model: grant.model,
        maxOutputTokens: grant.maxOutputTokens,
        now: unixNow(),
      });
    },
  };
}
