import type { FastifyInstance } from "fastify";

/** Logs one fixed line per answered request: method, route template, status and duration. */
export function logResponses(app: FastifyInstance, message: string): void {
  app.addHook("onResponse", async (req, reply) => {
    req.log.info(
      {
        method: req.method,
        route: req.routeOptions.url,
        status: reply.statusCode,
        ms: Math.round(reply.elapsedTime),
      },
      message,
    );
  });
}
