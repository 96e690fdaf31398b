import type { FastifyInstance } from "fastify";

/** A server's draining switch: set it before close() so kept-alive callers let go. */
export interface Drain {
  readonly draining: boolean;
  start(): void;
}

/**
 * While draining, closes a caller's kept-alive connection once its response is sent: left idle,
 * it would hold app.close() (and so the exit) until the caller drops it, which a proxy may never
 * do before the shutdown timeout. Connections already idle are closed by close() itself.
 */
export function closeConnectionsWhileDraining(app: FastifyInstance): Drain {
  let draining = false;
  app.addHook("onRequest", async (req, reply) => {
    const socket = req.raw.socket;
    reply.raw.once("finish", () => {
      if (draining) socket.end();
    });
  });
  return {
    get draining() {
      return draining;
    },
    start() {
      draining = true;
    },
  };
}
