import type { MessageInitShape } from "@bufbuild/protobuf";
import { Route } from "@tollgate/proto/auth";
import type { CompletionInputSchema } from "@tollgate/proto/inference";
import { Door, Operation } from "@tollgate/proto/inference";
import type { FastifyInstance } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { callerGone } from "../http/caller.js";
import { bearerKey } from "../http/credentials.js";
import { relayStream } from "../http/sse.js";
import { chatRequestSchema, outputCapOf } from "../schemas/chat.js";
import { authorizeRequest, moneyHeaders, moneyOf } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";

/** Readable one-line description of the first validation problems. */
export function describeInvalid(issues: ReadonlyArray<{ path: PropertyKey[]; message: string }>): string {
  return issues
    .slice(0, 3)
    .map((i) => `${i.path.map(String).join(".") || "body"}: ${i.message}`)
    .join("; ");
}

/** POST /v1/chat/completions: the account door's chat route, buffered or streamed (spec, "Endpoints"). */
export function chatCompletionsRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.post("/v1/chat/completions", async (req, reply) => {
    bearerKey(req.headers);
    const parsed = chatRequestSchema.safeParse(req.body);
    if (!parsed.success) {
      // The key is checked first, so a bad key gets its 401 whatever the body holds.
      await authorizeRequest(ctx, req, reply, { route: Route.CHAT_COMPLETIONS });
      throw new EdgeError("invalid_request", describeInvalid(parsed.error.issues));
    }
    const body = parsed.data;
    const grant = await authorizeRequest(ctx, req, reply, {
      route: Route.CHAT_COMPLETIONS,
      model: body.model ?? "",
      maxOutputTokens: outputCapOf(body),
      messageCount: body.messages.length,
    });
    const scope = `${grant.principal?.accountId}:${grant.principal?.keyId}:chat`;
    if (await ctx.idempotency.guard(req, reply, scope, body.stream === true)) return reply;
    const input: MessageInitShape<typeof CompletionInputSchema> = {
      requestId: req.id,
      operation: Operation.CHAT,
      model: grant.model,
      ...(grant.maxOutputTokens !== undefined ? { maxOutputTokens: grant.maxOutputTokens } : {}),
      body: req.rawBody!,
      billing: {
        door: Door.ACCOUNT,
        accountId: grant.principal?.accountId ?? "",
        connectionId: grant.principal?.connectionId ?? "",
        keyId: grant.principal?.keyId ?? "",
        reservationId: grant.reservationId,
      },
    };
    if (body.stream) {
      const signal = callerGone(reply);
      const includeUsage = body.stream_options?.include_usage === true;
      return relayStream(
        req,
        reply,
        ctx.inference.streamComplete({ input, includeUsage }, { signal }),
        signal,
        moneyOf(grant),
      );
    }

    const res = await ctx.inference.complete({ input }, { signal: callerGone(reply) });
    moneyHeaders(reply, grant, res.usage?.cost);
    return reply.type("application/json").send(Buffer.from(res.body));
  });
}
