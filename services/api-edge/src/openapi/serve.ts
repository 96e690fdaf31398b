import type { RouteId } from "@tollgate/proto/routes";
import type { RouteImpl } from "../routes/register.js";
import { documentBytes, type OpenApiDocument } from "./document.js";
import type { PaidOffer } from "./payment-info.js";
import { publicDocument } from "./public.js";

/**
 * Serves an OpenAPI document: its JSON bytes made once, when the app is built, and sent as they
 * are on every request (no key, nothing billed or counted against a limit).
 */
export function openApiRoute(doc: OpenApiDocument): RouteImpl {
  const bytes = documentBytes(doc);
  return {
    handler: async (_req, reply) => reply.type("application/json; charset=utf-8").send(bytes),
  };
}

/**
 * GET /openapi.json of the public port: the document of exactly the routes the app registers
 * (`routes`, this one included), with the configured message limit and the paid door's prices.
 */
export function publicOpenApiRoute(
  routes: Partial<Record<RouteId, RouteImpl>>,
  maxMessages: number,
  offer: PaidOffer | undefined,
): RouteImpl {
  const ids = [...(Object.keys(routes) as RouteId[]), "openapi" as const];
  return openApiRoute(
    publicDocument({ routes: [...new Set(ids)], maxMessages, ...(offer ? { offer } : {}) }),
  );
}
