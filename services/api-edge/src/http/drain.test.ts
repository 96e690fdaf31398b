import { Agent, request } from "node:http";
import Fastify from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { closeConnectionsWhileDraining } from "./drain.js";
import { SseWriter } from "./sse.js";

const agent = new Agent({ keepAlive: true });
const apps: { close(): Promise<unknown> }[] = [];
afterEach(async () => {
  for (const app of apps.splice(0)) await app.close();
  agent.destroy();
});

/** GETs `path` on a kept-alive connection; resolves with the answer's Connection header and body. */
function get(port: number, path: string): Promise<{ connection: string | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path, agent }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => {
        body += d;
      });
      res.on("end", () => resolve({ connection: res.headers.connection, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("a drain", () => {
  it("closes the connection of a stream whose headers leave after it began, as of any other answer", async () => {
    const app = Fastify();
    apps.push(app);
    const drain = closeConnectionsWhileDraining(app, 50);
    let release!: () => void;
    const released = new Promise<void>((r) => {
      release = r;
    });
    let arrived!: () => void;
    const waiting = new Promise<void>((r) => {
      arrived = r;
    });
    app.get("/stream", async (_req, reply) => {
      arrived();
      // Still authorizing when the drain begins: the stream's headers leave after it.
      await released;
      const sse = new SseWriter(reply.raw);
      sse.open({});
      await sse.send([{ data: "one" }]);
      reply.raw.end();
      return reply;
    });
    app.get("/plain", async () => ({ ok: true }));
    await app.listen({ host: "127.0.0.1", port: 0 });
    const { port } = app.server.address() as { port: number };

    const stream = get(port, "/stream");
    await waiting;
    const draining = drain.start();
    release();
    const answer = await stream;
    expect(answer.body).toContain("data: one");
    // A kept-alive connection here would be ended after the stream, under the caller's next request.
    expect(answer.connection).toBe("close");
    await draining;
  });
});
