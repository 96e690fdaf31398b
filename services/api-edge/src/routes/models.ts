import { Route } from "@tollgate/proto/auth";
import type { FastifyInstance } from "fastify";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";

/** GET /v1/models: the models the calling key may use, in OpenAI's list shape. */
export function modelsRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.get("/v1/models", async (req, reply) => {
    const grant = await authorizeRequest(ctx, req, reply, { route: Route.MODELS });
    const prices = new Map(grant.modelPrices.map((p) => [p.model, p]));
    return {
      object: "list",
      data: grant.allowedModels.map((id) => {
        const price = prices.get(id);
        return {
          id,
          object: "model",
          created: 0,
          owned_by: "tollgate",
          // Extension fields (the OpenAI SDK ignores them): base units of the payment token
          // (6 decimals) per million tokens, so callers can choose before they spend.
          ...(price
            ? {
                pricing: {
                  input_per_million: price.inputPerMillion,
                  output_per_million: price.outputPerMillion,
                  currency_decimals: 6,
                },
              }
            : {}),
        };
      }),
    };
  });
}
