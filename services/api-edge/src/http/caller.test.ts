import { createServer, type Server } from "node:http";
import { connect } from "node:net";
import type { FastifyReply } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { callerGone } from "./caller.js";

let server: Server | undefined;
afterEach(async () => {
  await new Promise((r) => server?.close(r) ?? r(undefined));
  server = undefined;
});

/**
 * Sends one request on a raw socket and runs `handle` on the server side once the request's
 * body is read, with `leave` telling whether the caller closes its socket first.
 */
async function exchange(leave: boolean, handle: (reply: FastifyReply) => Promise<void>): Promise<void> {
  let done!: (err?: unknown) => void;
  const finished = new Promise<void>((resolve, reject) => {
    done = (err) => (err ? reject(err) : resolve());
  });
  server = createServer((req, res) => {
    req.resume();
    req.on("end", async () => {
      // The caller's socket close reaches the server before the handler goes on.
      if (leave) await new Promise<void>((r) => (res.closed ? r() : res.once("close", () => r())));
      await handle({ raw: res } as unknown as FastifyReply).then(() => done(), done);
      if (!res.closed) res.end("ok");
    });
  });
  await new Promise<void>((r) => server!.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  const socket = connect(port, "127.0.0.1", () => {
    socket.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
    if (leave) socket.destroy();
  });
  socket.on("error", () => {});
  socket.on("data", () => socket.destroy());
  await finished;
}

describe("callerGone", () => {
  it("is already aborted when the caller left before it was asked (while its key or payment was checked)", async () => {
    await exchange(true, async (reply) => {
      expect(callerGone(reply).aborted).toBe(true);
    });
  });

  it("is not aborted for a caller still there, and aborts when it leaves later", async () => {
    await exchange(false, async (reply) => {
      const signal = callerGone(reply);
      expect(signal.aborted).toBe(false);
      const closed = new Promise((r) => reply.raw.once("close", r));
      reply.raw.destroy();
      await closed;
      expect(signal.aborted).toBe(true);
    });
  });

  it("is not aborted by the close of a response that was finished", async () => {
    await exchange(false, async (reply) => {
      const signal = callerGone(reply);
      await new Promise<void>((r) => reply.raw.end("done", () => r()));
      await new Promise((r) => setImmediate(r));
      expect(signal.aborted).toBe(false);
    });
  });
});
