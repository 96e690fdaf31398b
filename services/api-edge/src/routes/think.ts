import { Route } from "@tollgate/proto/auth";
import { Operation } from "@tollgate/proto/inference";
import type { FastifyInstance } from "fastify";
import { chatBodyFromThink, thinkFromChat } from "../domain/think.js";
import { callerGone } from "../http/caller.js";
import { thinkOutputCapOf } from "../schemas/think.js";
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

/**
 * POST /v1/think: Tollgate's reasoning route (docs/account-door.md, "Routes"). Translated to a chat
 * request that requires reasoning: the router, which holds the model configuration, refuses a
 * model configured with `reasoning: false` before any upstream call. The upstream's
 * `reasoning_content` and content come back as `reasoning` and `answer`.
 */
export function thinkRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.post("/v1/think", async (req, reply) => {
    const body = await parseAccountBody(ctx, req, reply, Route.THINK, ctx.schemas.think);
    const grant = await authorizeRequest(ctx, req, reply, {
      route: Route.THINK,
      model: body.model ?? "",
      maxOutputTokens: thinkOutputCapOf(body),
      messageCount: body.messages?.length ?? 1,
      requireReasoning: true,
    });
    if (await guardIdempotency(ctx, req, reply, grant, "think", false)) return reply;
    const chat = chatBodyFromThink(body, grant.model, grant.maxOutputTokens);
    const input = completionInput(req, grant, Operation.CHAT, Buffer.from(JSON.stringify(chat)), {
      requireReasoning: true,
    });
    const res = await completeOrRelease(ctx, req, grant, () =>
      ctx.inference.complete({ input }, { signal: callerGone(reply) }),
    );
    moneyHeaders(reply, grant, res.usage?.cost);
    const { answer, usage } = chatResultOf(res);
    return thinkFromChat(answer, usage, { id: objectId("think"), model: grant.model, now: unixNow() });
  });
}
