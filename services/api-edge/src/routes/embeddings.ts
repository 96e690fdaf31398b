import { Operation } from "@tollgate/proto/inference";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { callerGone } from "../http/caller.js";
import { inputCountOf } from "../schemas/embeddings.js";
import { completionInput, guardIdempotency, parseAccountBody } from "./account-inference.js";
import { authorizeRequest, completeOrRelease, moneyHeaders } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const { operation, schema } = ROUTES.embeddings;

/** One vector of the answer: numbers (`encoding_format: float`) or base64 float32s. */
type Vector = number[] | string;

/**
 * POST /v1/embeddings: OpenAI's embeddings (docs/account-door.md, "Routes"), buffered. Nothing is
 * generated, so the output cap is 0 and the quote is the input bound alone; the hold is settled
 * to the input tokens the upstream reports (never above the quote). The router sends the body to
 * the upstream's /v1/embeddings and refuses a model that is not an embedding model.
 */
export function embeddingsRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const body = await parseAccountBody(ctx, req, reply, OPERATIONS[operation], ctx.schemas[schema]);
      const grant = await authorizeRequest(ctx, req, reply, {
        route: OPERATIONS[operation],
        model: body.model,
        maxOutputTokens: 0,
        messageCount: inputCountOf(body),
      });
      if (await guardIdempotency(ctx, req, reply, grant, operation, false)) return reply;
      const input = completionInput(req, grant, Operation.EMBEDDINGS, req.rawBody!);
      const res = await completeOrRelease(ctx, req, grant, () =>
        ctx.inference.complete({ input }, { signal: callerGone(reply) }),
      );
      moneyHeaders(reply, grant, res.usage?.cost);
      const inputTokens = res.usage?.inputTokens ?? 0;
      return {
        object: "list",
        data: vectorsOf(JSON.parse(Buffer.from(res.body).toString("utf8"))).map((embedding, index) => ({
          object: "embedding",
          index,
          embedding,
        })),
        model: grant.model,
        usage: { prompt_tokens: inputTokens, total_tokens: inputTokens },
      };
    },
  };
}

/**
 * The vectors of the router's answer (which checked the upstream sent a list of them), in input
 * order: by each item's `index` when it gives one.
 */
function vectorsOf(json: unknown): Vector[] {
  const data = (json as { data?: unknown } | null)?.data;
  const items = (Array.isArray(data) ? data : []).map((item: unknown, i) => {
    const { embedding, index } = (item ?? {}) as { embedding?: unknown; index?: unknown };
    return { embedding: (embedding ?? []) as Vector, index: typeof index === "number" ? index : i };
  });
  return items.sort((a, b) => a.index - b.index).map((item) => item.embedding);
}
