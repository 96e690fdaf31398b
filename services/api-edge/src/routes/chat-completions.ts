import type { MessageInitShape } from "@bufbuild/protobuf";
import { Route } from "@tollgate/proto/auth";
import type { CompletionInputSchema } from "@tollgate/proto/inference";
import { type CompletionInput, Door, Operation } from "@tollgate/proto/inference";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { callerGone } from "../http/caller.js";
import { bearerKey } from "../http/credentials.js";
import { errorBody, toHttpError } from "../http/errors.js";
import { SseWriter } from "../http/sse.js";
import { type ChatRequest, chatRequestSchema, outputCapOf } from "../schemas/chat.js";
import { authorizeRequest } from "./authorize.js";
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
    if (body.stream) return streamCompletion(req, reply, ctx, input, body);

    const res = await ctx.inference.complete({ input }, { signal: callerGone(reply) });
    if (res.usage) reply.header("x-tollgate-cost", res.usage.cost);
    return reply.type("application/json").send(Buffer.from(res.body));
  });
}

async function streamCompletion(
  req: FastifyRequest,
  reply: FastifyReply,
  ctx: AccountRouteContext,
  input: MessageInitShape<typeof CompletionInputSchema> | CompletionInput,
  body: ChatRequest,
): Promise<FastifyReply> {
  const signal = callerGone(reply);
  const events = ctx.inference
    .streamComplete({ input, includeUsage: body.stream_options?.include_usage === true }, { signal })
    [Symbol.asyncIterator]();
  // Until the first event arrives the caller can still get a plain JSON error with its status.
  let next = await events.next();
  reply.hijack();
  const sse = new SseWriter(reply.raw);
  sse.open({ "x-request-id": req.id });
  const started = performance.now();
  let outcome = "completed";
  try {
    while (!next.done) {
      const event = next.value.event;
      if (event.case === "chunk") await sse.data(event.value);
      next = await events.next();
    }
    sse.end();
  } catch (err) {
    if (signal.aborted) {
      outcome = "client_cancelled";
    } else {
      outcome = "failed";
      await sse.data(JSON.stringify(errorBody(toHttpError(err, req.log), req.id)));
      sse.close();
    }
  }
  req.log.debug({ outcome, ms: Math.round(performance.now() - started) }, "stream ended");
  return reply;
}
