import type { AuthorizeResponse } from "@tollgate/proto/auth";
import { OPERATIONS, ROUTES } from "@tollgate/proto/routes";
import { EdgeError } from "../domain/errors.js";
import { authorizeRequest } from "./authorize.js";
import type { AccountRouteContext } from "./context.js";
import type { RouteImpl } from "./register.js";

const MODELS = OPERATIONS[ROUTES.models.operation];

/** A model as OpenAI's model object, with its price as an extension field. */
function modelObject(id: string, price: AuthorizeResponse["modelPrices"][number] | undefined) {
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
}

/** GET /v1/models: the models the calling key may use, in OpenAI's list shape. */
export function modelsRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const grant = await authorizeRequest(ctx, req, reply, { route: MODELS });
      const prices = new Map(grant.modelPrices.map((p) => [p.model, p]));
      return { object: "list", data: grant.allowedModels.map((id) => modelObject(id, prices.get(id))) };
    },
  };
}

/**
 * GET /v1/models/{model}: one model the calling key may use, as in the list. A model the key may
 * not use is answered exactly as one that does not exist, so a key never learns what others see.
 */
export function modelRoute(ctx: AccountRouteContext): RouteImpl {
  return {
    handler: async (req, reply) => {
      const { model } = req.params as { model: string };
      const grant = await authorizeRequest(ctx, req, reply, { route: MODELS });
      if (!grant.allowedModels.includes(model)) {
        throw new EdgeError("not_found", "the model does not exist or this key cannot use it");
      }
      return modelObject(
        model,
        grant.modelPrices.find((p) => p.model === model),
      );
    },
  };
}
