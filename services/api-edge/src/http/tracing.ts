import {
  ATTR,
  extractHeaders,
  failSpan,
  runInSpan,
  type Span,
  SpanKind,
  startSpan,
  tracingEnabled,
} from "@tollgate/kit/tracing";
import { ROUTE_IDS, ROUTES } from "@tollgate/proto/routes";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { closedStatus } from "./response-log.js";

/** The door of each route template (packages/proto/src/routes.ts); the probes have none. */
const DOOR_BY_PATH: ReadonlyMap<string, string> = new Map(
  ROUTE_IDS.filter((id) => ROUTES[id].door !== "public").map((id) => [ROUTES[id].path, ROUTES[id].door]),
);

/**
 * One server span per request, named for the route template ("POST /v1/chat/completions"),
 * continuing the caller's W3C traceparent when it sent one; the gRPC calls the handler makes
 * become its children. The span ends when the response closes, so a stream cut short by the
 * caller ends it too (status 499, as in the metrics). Tracing off: no hook is added at all.
 */
export function traceRequests(app: FastifyInstance): void {
  if (!tracingEnabled()) return;
  const spans = new WeakMap<FastifyRequest, Span>();
  app.addHook("onRequest", (req, reply, done) => {
    const route = req.routeOptions.url;
    const door = route === undefined ? undefined : DOOR_BY_PATH.get(route);
    const span = startSpan(
      route ? `${req.method} ${route}` : req.method,
      SpanKind.SERVER,
      {
        [ATTR.httpMethod]: req.method,
        ...(route ? { [ATTR.httpRoute]: route } : {}),
        ...(door ? { [ATTR.door]: door } : {}),
      },
      extractHeaders(req.headers),
    );
    spans.set(req, span);
    reply.raw.once("close", () => {
      const status = closedStatus(reply);
      span.setAttribute(ATTR.httpStatus, status);
      if (status >= 500) failSpan(span, String(status));
      span.end();
    });
    done();
  });
  // After the body is parsed (parsing runs in the socket's async context, not this one): the
  // handler and the hooks after this one run with the request's span active.
  app.addHook("preHandler", (req, _reply, done) => {
    const span = spans.get(req);
    if (span) runInSpan(span, done);
    else done();
  });
}
