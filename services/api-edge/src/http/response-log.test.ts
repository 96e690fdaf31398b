import { request } from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import Fastify, { type FastifyBaseLogger } from "fastify";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { logResponses } from "./response-log.js";

/** A server logging its answers into `lines`, whose one route answers once its caller has gone. */
async function server() {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(JSON.parse(chunk.toString()));
      done();
    },
  });
  const app = Fastify({ loggerInstance: pino(sink) as FastifyBaseLogger });
  logResponses(app, "request served");
  app.get("/ok", async () => ({ ok: true }));
  app.get("/late", async (req) => {
    // The model answered as the caller left: the answer is written to a closed connection.
    await new Promise((resolve) => req.raw.socket.once("close", resolve));
    return { ok: true };
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  return { app, lines, port: (app.server.address() as AddressInfo).port };
}

const served = (lines: Array<Record<string, unknown>>) => lines.filter((l) => l.msg === "request served");

describe("the per-request log line", () => {
  it("is written for an answer, and for one whose caller left while it was written (status 499)", async () => {
    const { app, lines, port } = await server();
    try {
      await fetch(`http://127.0.0.1:${port}/ok`);
      const req = request({ host: "127.0.0.1", port, path: "/late" });
      req.on("error", () => {});
      req.end();
      await new Promise((resolve) => setTimeout(resolve, 50));
      req.destroy();
      await expect.poll(() => served(lines).length, { timeout: 2_000 }).toBe(2);
      expect(served(lines).map((l) => [l.route, l.status])).toEqual([
        ["/ok", 200],
        ["/late", 499],
      ]);
    } finally {
      await app.close();
    }
  });
});
