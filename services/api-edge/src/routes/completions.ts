import { Operation } from "@tollgate/proto/inference";
import { outputCapOf, outputSequencesOf } from "../schemas/chat.js";
import { promptCountOf } from "../schemas/completions.js";
import type { AccountRouteContext } from "./context.js";
import { forwardedRoute } from "./forwarded.js";
import type { RouteImpl } from "./register.js";

/**
 * POST /v1/completions: OpenAI's legacy text completion (docs/contract.md, "The two doors"),
 * buffered or streamed: every prompt, and every choice of each, is priced into the quote.
 */
export function completionsRoute(ctx: AccountRouteContext): RouteImpl {
  return forwardedRoute(ctx, "completions", ctx.schemas.completion, Operation.TEXT, (body) => {
    const prompts = promptCountOf(body);
    return {
      maxOutputTokens: outputCapOf(body),
      messageCount: prompts,
      outputSequences: outputSequencesOf(body, prompts),
    };
  });
}
