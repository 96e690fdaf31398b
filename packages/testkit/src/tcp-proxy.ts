import { createServer, type Socket, connect as tcpConnect } from "node:net";

/** A TCP proxy in front of a server (Redis, say) that can lose a reply on purpose. */
export interface ReplyLosingProxy {
  /** The target's URL with the proxy's host and port (scheme and path kept). */
  url: string;
  /**
   * The next reply the server sends is dropped and both connections are cut: the server ran
   * the command, the client never hears of it (a connection lost at the worst moment).
   */
  loseNextReply(): void;
  close(): void;
}

/** Starts a proxy to `target` (a URL with host and port) on a free port of 127.0.0.1. */
export async function startReplyLosingProxy(target: string): Promise<ReplyLosingProxy> {
  const to = new URL(target);
  let lose = false;
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = tcpConnect(Number(to.port), to.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => undefined);
      s.on("close", () => sockets.delete(s));
    }
    client.pipe(upstream);
    upstream.on("data", (chunk: Buffer) => {
      if (!lose) {
        client.write(chunk);
        return;
      }
      lose = false;
      client.destroy();
      upstream.destroy();
    });
    client.on("close", () => upstream.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  const url = new URL(target);
  url.hostname = "127.0.0.1";
  url.port = String(port);
  return {
    url: url.toString(),
    loseNextReply: () => {
      lose = true;
    },
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}
