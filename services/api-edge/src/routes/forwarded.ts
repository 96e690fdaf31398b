import type { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import type { z } from "zod";
import { completionInput, guardIdempotency, parseAccountBody, serveCompletion } from "./account-inference.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

/** What every forwarded body has: the fields the gateway reads before the router forwards it. */
interface ForwardedBody {
  model?: string | undefined;
  stream?: boolean | null | undefined;
  stream_options?: { include_usage?: boolean | undefined } | null | undefined;
}

/** What a forwarded body asks the quote to cover besides its bytes. */
export interface ForwardedCounts {
  /** The smallest output cap the body names, if any (the connection's default otherwise). */
  maxOutputTokens: number | undefined;
  /** Messages (chat) or prompts (legacy completions). */
  messageCount: number;
  /** Output sequences the upstream is asked for (docs/money.md, "The quote"). */
  outputSequences: number;
}

/**
 * A route whose body is forwarded as received (docs/contract.md, "The two doors"): parsed and
 * checked with the route's schema, guarded by its Idempotency-Key, authorized for its quote, then
 * served buffered or streamed; the router rewrites only the model and the output cap. Chat and
 * legacy completions differ in their schema, their operation and what their body counts.
 */
export function forwardedRoute<S extends z.ZodType<ForwardedBody>>(
  ctx: AccountRouteContext,
  key: "chat" | "completions",
  schema: S,
  kind: Operation,
  counts: (body: z.output<S>) => ForwardedCounts,
): RouteImpl {
  const { operation } = ROUTES[key];
  return {
    handler: async (req, reply) => {
      const route = OPERATIONS[operation];
      const body = await parseAccountBody(ctx, req, reply, route, schema);
      const streaming = body.stream === true;
      if (await guardIdempotency(ctx, req, reply, { route, scope: operation, streaming })) return reply;
      const grant = await authorizeRequest(ctx, req, reply, {
        route,
        model: body.model ?? "",
        ...counts(body),
      });
      const input = completionInput(req, grant, kind, req.rawBody!);
      const stream = streaming ? { includeUsage: body.stream_options?.include_usage === true } : undefined;
      return serveCompletion(ctx, req, reply, grant, input, stream);
    },
  };
}
