import { Route } from "@tollgate/proto/auth";
import { Operation } from "@tollgate/proto/inference";
import type { FastifyInstance } from "fastify";
import { outputCapOf, outputSequencesOf } from "../schemas/chat.js";
import { promptCountOf } from "../schemas/completions.js";
import { completionInput, guardIdempotency, parseAccountBody, serveCompletion } from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";

/**
 * POST /v1/completions: OpenAI's legacy text completion (docs/contract.md, "The two doors"),
 * buffered or streamed. The caller's body is forwarded as received; the router sends it to the
 * upstream's /v1/completions with the model and output cap rewritten.
 */
export function completionsRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.post("/v1/completions", async (req, reply) => {
    const body = await parseAccountBody(ctx, req, reply, Route.COMPLETIONS, ctx.schemas.completion);
    const grant = await authorizeRequest(ctx, req, reply, {
      route: Route.COMPLETIONS,
      model: body.model ?? "",
      maxOutputTokens: outputCapOf(body),
      messageCount: promptCountOf(body),
      outputSequences: outputSequencesOf(body, promptCountOf(body)),
    });
    if (await guardIdempotency(ctx, req, reply, grant, "completions", body.stream === true)) return reply;
    const input = completionInput(req, grant, Operation.TEXT, req.rawBody!);
    const stream = body.stream ? { includeUsage: body.stream_options?.include_usage === true } : undefined;
    return serveCompletion(ctx, req, reply, grant, input, stream);
  });
}
