import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";
import type { RouteId } from "@tollgate/proto/routes";
import type { RouteImpl } from "../routes/register.js";
import { documentBytes, type OpenApiDocument } from "./document.js";
import type { PaidOffer } from "./payment-info.js";
import { publicDocument } from "./public.js";

/**
 * Serves an OpenAPI document: its JSON bytes, and their gzip, made once when the app is built and
 * sent as they are on every request (no key, nothing billed or counted against a limit). The
 * ETag lets a client that polls it get a bodiless 304; `cacheControl`, when given, is sent too.
 */
export function openApiRoute(doc: OpenApiDocument, cacheControl?: string): RouteImpl {
  const bytes = documentBytes(doc);
  const gzipped = gzipSync(bytes, { level: 9 });
  const etag = `"${createHash("sha256").update(bytes).digest("base64url").slice(0, 27)}"`;
  return {
    handler: async (req, reply) => {
      reply.type("application/json; charset=utf-8").header("etag", etag).header("vary", "accept-encoding");
      if (cacheControl) reply.header("cache-control", cacheControl);
      if (req.headers["if-none-match"] === etag) return reply.code(304).send();
      if (/\bgzip\b/.test(req.headers["accept-encoding"] ?? "")) {
        return reply.header("content-encoding", "gzip").send(gzipped);
      }
      return reply.send(bytes);
    },
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
  // It changes only with a restart (a new configuration), so caches may keep it a while.
  return openApiRoute(
    publicDocument({ routes: [...new Set(ids)], maxMessages, ...(offer ? { offer } : {}) }),
    "public, max-age=300",
  );
}
