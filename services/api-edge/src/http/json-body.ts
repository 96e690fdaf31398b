import type { FastifyInstance } from "fastify";

/** The two ways a body can be refused before any route sees it. */
export type BodyErrorCode = "invalid_json" | "unsupported_media_type";

/**
 * Accepts only `application/json` bodies on `app`: keeps the exact bytes as `req.rawBody`
 * (forwarded as received and, on the paid door, digested), parses them, and refuses anything
 * else with the boundary's own error class. An empty body parses as undefined.
 */
export function acceptJsonOnly(
  app: FastifyInstance,
  error: (code: BodyErrorCode, message: string) => Error,
): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (req, body: Buffer, done) => {
    req.rawBody = body;
    if (body.length === 0) return done(null, undefined);
    try {
      done(null, JSON.parse(body.toString("utf8")));
    } catch {
      done(error("invalid_json", "the request body is not valid JSON"), undefined);
    }
  });
  app.addContentTypeParser("*", (_req, _payload, done) =>
    done(error("unsupported_media_type", "send the body as Content-Type: application/json"), undefined),
  );
}
