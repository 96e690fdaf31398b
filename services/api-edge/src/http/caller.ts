import type { FastifyReply } from "fastify";

/** An AbortSignal that fires when the caller goes away before the response is finished. */
export function callerGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) controller.abort();
  });
  return controller.signal;
}
