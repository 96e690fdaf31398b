import type { FastifyInstance, FastifyReply } from "fastify";

/**
 * The status a request ended with, read when its response closes: the status sent, or 499 when
 * the caller went away before the answer was all written (a stream cut short, an answer written
 * to a closing connection), which never reaches Fastify's onResponse hooks.
 */
export function closedStatus(reply: FastifyReply): number {
  return reply.raw.writableFinished ? reply.raw.statusCode : 499;
}

/**
 * Logs one fixed line per request when its response closes: method, route template, status
 * (499: the caller went away first) and duration. Every request gets its line, also one charged
 * whose caller left while its answer was written (docs/money.md, "An answer written as its
 * caller leaves").
 */
export function logResponses(app: FastifyInstance, message: string): void {
  app.addHook("onRequest", (req, reply, done) => {
    reply.raw.once("close", () => {
      req.log.info(
        {
          method: req.method,
          route: req.routeOptions.url,
          status: closedStatus(reply),
          ms: Math.round(reply.elapsedTime),
        },
        message,
      );
    });
    done();
  });
}
