import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { Server } from "node:net";
import type { FastifyInstance } from "fastify";

/** A server's draining switch: start it before close() so kept-alive callers let go. */
export interface Drain {
  readonly draining: boolean;
  /**
   * Refuses new connections and lets the kept-alive ones go cleanly; resolves once none is open,
   * or after `lingerMs`, when close() may close what is left idle.
   */
  start(): Promise<void>;
}

/**
 * How long a drain waits for kept-alive connections to end by themselves before close() closes
 * the idle ones. A connection in use ends with its next response; only one idle for this long
 * meets close(), so only a request sent on it at that very instant is cut (docs/runbooks/api-edge.md,
 * "Graceful shutdown").
 */
export const DRAIN_LINGER_MS = 1_000;

/**
 * While draining, every response says `Connection: close` and its connection closes once it is
 * sent. Closing a kept-alive connection between two requests would cut the caller's next
 * request, already on its way (its caller sees a reset, not an answer), and left idle it would
 * hold app.close() (and so the exit) until the caller drops it, which a proxy may never do before
 * the shutdown timeout. So start() stops listening at once, then waits up to `lingerMs` for the
 * open connections to end with a response, before close() closes what is left idle.
 */
export function closeConnectionsWhileDraining(app: FastifyInstance, lingerMs = DRAIN_LINGER_MS): Drain {
  let draining = false;
  let lingerOver = false;
  const open = new Set<Socket>();
  /** Responses not finished yet: those whose headers are still unsent get `Connection: close`. */
  const unfinished = new Set<ServerResponse>();
  let allClosed: (() => void) | undefined;
  app.server.on("connection", (socket: Socket) => {
    open.add(socket);
    socket.once("close", () => {
      open.delete(socket);
      if (open.size === 0) allClosed?.();
    });
  });
  app.addHook("onRequest", async (req, reply) => {
    const res = reply.raw;
    if (draining) res.setHeader("connection", "close");
    else unfinished.add(res);
    const socket = req.raw.socket;
    res.once("close", () => unfinished.delete(res));
    // A response whose headers went out before the drain began (a stream) kept its connection
    // alive. Until the linger is over, the connection's next request gets `Connection: close`;
    // after it, close() no longer sees the connection go idle, so it is closed once the response
    // is sent.
    res.once("finish", () => {
      if (lingerOver && res.shouldKeepAlive) socket.end();
    });
  });
  return {
    get draining() {
      return draining;
    },
    async start() {
      draining = true;
      for (const res of unfinished) if (!res.headersSent) res.setHeader("connection", "close");
      unfinished.clear();
      // Stop listening without http.Server.close(), which would close the idle connections too.
      if (app.server.listening) Server.prototype.close.call(app.server);
      if (open.size > 0) {
        let timer: NodeJS.Timeout | undefined;
        await new Promise<void>((resolve) => {
          allClosed = resolve;
          timer = setTimeout(resolve, lingerMs);
        });
        clearTimeout(timer);
        allClosed = undefined;
      }
      lingerOver = true;
    },
  };
}
