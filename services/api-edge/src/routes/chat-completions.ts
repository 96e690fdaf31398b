import { Operation } from "@tollgate/proto/inference";
import { outputCapOf, outputSequencesOf } from "../schemas/chat.js";
import type { AccountRouteContext } from "./context.js";
import { forwardedRoute } from "./forwarded.js";
import type { RouteImpl } from "./register.js";

/** POST /v1/chat/completions: the account door's chat route, buffered or streamed (docs/contract.md). */
export function chatCompletionsRoute(ctx: AccountRouteContext): RouteImpl {
  return forwardedRoute(ctx, "chat", ctx.schemas.chat, Operation.CHAT, (body) => ({
    maxOutputTokens: outputCapOf(body),
    messageCount: body.messages.length,
    outputSequences: outputSequencesOf(body),
  }));
}
