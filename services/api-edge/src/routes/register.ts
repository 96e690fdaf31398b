import { METHODS as NODE_METHODS } from "node:http";
import {
  allowedMethods,
  ROUTE_IDS,
  ROUTES,
  type RouteId,
  type RouteIdOn,
  type RouteSpec,
} from "@tollgate/proto/routes";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { EdgeError } from "../domain/errors.js";
import { errorBody, httpErrorOf } from "../http/errors.js";

/** How one route of the table is served: its handler, and an error handler of its own if any. */
export interface RouteImpl {
  handler: (req: FastifyRequest, reply: FastifyReply) => Promise<unknown>;
  errorHandler?: (err: unknown, req: FastifyRequest, reply: FastifyReply) => unknown;
  /** Runs first on every answer of its path, the 405s and OPTIONS included (headers every answer carries). */
  onRequest?: (req: FastifyRequest, reply: FastifyReply) => Promise<void>;
}

/** Every account-door route of the table, implemented: a route added to the table and not here does not compile. */
export type AccountRoutes = Record<RouteIdOn<"account">, RouteImpl>;

/**
 * Every method Node's parser accepts but CONNECT (refused before routing: no proxy here); on a
 * known path, those the table does not give it are refused. Fastify routes only a few of them
 * unless told, so the others (PROPFIND, SEARCH, PURGE, ...) would otherwise fall through to the
 * 404 of an unknown path, in the account door's shape even on the paid path.
 */
const METHODS = NODE_METHODS.filter((m) => m !== "CONNECT");

/**
 * Registers the routes of `impls` at their method and path of the table
 * (packages/proto/src/routes.ts), and on each of their paths every other method: OPTIONS
 * answers 204 and the others 405 `method_not_allowed`, both with an `Allow` header naming the
 * path's methods. The refusal comes before the body is read or the key checked.
 */
export function registerRoutes(app: FastifyInstance, impls: Partial<Record<RouteId, RouteImpl>>): void {
  // Bodyless to fastify: a refused method's body is never parsed (Node discards it).
  for (const m of METHODS) if (!app.supportedMethods.includes(m)) app.addHttpMethod(m);
  const ids = ROUTE_IDS.filter((id) => impls[id] !== undefined);
  for (const id of ids) {
    const spec: RouteSpec = ROUTES[id];
    app.route({ method: spec.method, url: spec.path, ...impls[id]! });
  }
  for (const path of new Set(ids.map((id) => ROUTES[id].path))) {
    const onPath = ids.filter((id) => ROUTES[id].path === path).map((id) => impls[id]!);
    // A path's 405 is answered by its routes' own error handler (their error shape) when they have one.
    const handleError = onPath.map((impl) => impl.errorHandler).find(Boolean);
    const first = onPath.map((impl) => impl.onRequest).find(Boolean);
    const allowed = allowedMethods(path, ids);
    const allow = allowed.join(", ");
    const others = METHODS.filter((m) => !allowed.includes(m));
    app.route({
      method: others,
      url: path,
      onRequest: async (req, reply) => {
        await first?.(req, reply);
        reply.header("allow", allow);
        if (req.method === "OPTIONS") return reply.code(204).send();
        const message = `${req.method} is not allowed here; use ${allow}`;
        if (handleError) return handleError(new EdgeError("method_not_allowed", message), req, reply);
        const e = httpErrorOf("method_not_allowed", message);
        return reply.code(e.status).send(errorBody(e, req.id));
      },
      // Never reached: onRequest has answered.
      handler: async (_req, reply) => reply,
    });
  }
}
