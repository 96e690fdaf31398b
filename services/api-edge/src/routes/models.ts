import { Route } from "@tollgate/proto/auth";
import type { FastifyInstance } from "fastify";
import { bearerKey } from "../http/credentials.js";
import { type AccountRouteContext, AUTH_TIMEOUT_MS } from "./context.js";

/** GET /v1/models: the models the calling key may use, in OpenAI's list shape. */
export function modelsRoute(app: FastifyInstance, ctx: AccountRouteContext): void {
  app.get("/v1/models", async (req) => {
    const grant = await ctx.auth.authorize(
      { key: bearerKey(req.headers), route: Route.MODELS, requestId: req.id },
      { timeoutMs: AUTH_TIMEOUT_MS },
    );
    return {
      object: "list",
      data: grant.allowedModels.map((id) => ({ id, object: "model", created: 0, owned_by: "tollgate" })),
    };
  });
}
