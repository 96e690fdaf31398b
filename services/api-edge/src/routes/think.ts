import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { chatBodyFromThink, thinkFromChat } from "../domain/think.js";
import { thinkOutputCapOf } from "../schemas/think.js";
import {
  completeChat,
  completionInput,
  guardIdempotency,
  objectId,
  parseAccountBody,
  unixNow,
} from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.think;

/**
 * POST /v1/think: Tollgate's reasoning route (docs/account-door.md, "Routes"). Translated to a chat
 * request that requires reasoning: the router, which holds the model configuration, refuses a
 * model configured with `reasoning: false` before any upstream call. The upstream's
 * `reasoning_content` and content come back as `reasoning` and `answer`.
 */
export function thinkRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const route = OPERATIONS[operation];
      const body = await parseAccountBody(ctx, req, reply, route, ctx.schemas[schema]);
      if (await guardIdempotency(ctx, req, reply, { route, scope: operation, streaming: false }))
        return reply;
      const grant = await authorizeRequest(ctx, req, reply, {
        route,
        model: body.model ?? "",
        maxOutputTokens: thinkOutputCapOf(body),
        messageCount: body.messages?.length ?? 1,
        requireReasoning: true,
      });
      const chat = chatBodyFromThink(body, grant.model, grant.maxOutputTokens);
      const input = completionInput(req, grant, Operation.CHAT, Buffer.from(JSON.stringify(chat)), {
        requireReasoning: true,
      });
      const { answer, usage } = await completeChat(ctx, req, reply, grant, input);
      return thinkFromChat(answer, usage, { id: objectId("think"), model: grant.model, now: unixNow() });
    },
  };
}
