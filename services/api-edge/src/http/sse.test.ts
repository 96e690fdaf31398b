import { request } from "node:http";
import type { Socket } from "node:net";
import { create } from "@bufbuild/protobuf";
import { type StreamCompleteResponse, StreamCompleteResponseSchema } from "@tollgate/proto/inference";
import Fastify, { type FastifyInstance } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { relayStream } from "./sse.js";

const encoder = new TextEncoder();
const chunk = (text: string) =>
  create(StreamCompleteResponseSchema, {
    event: {
      case: "chunk",
      value: encoder.encode(JSON.stringify({ choices: [{ delta: { content: text } }] })),
    },
  });

/**
 * A relayed stream whose router sends `first` and then waits for `release` before ending: what
 * left the socket while the first event was the only one is what the caller got first.
 */
async function serve(first: StreamCompleteResponse[], release: Promise<void>) {
  const app: FastifyInstance = Fastify();
  const writes: string[] = [];
  app.post("/stream", async (req, reply) => {
    const socket = req.raw.socket as Socket & {
      _write: (...a: unknown[]) => unknown;
      _writev: (...a: unknown[]) => unknown;
    };
    // Each write the socket makes to the kernel, in order.
    const write = socket._write.bind(socket);
    const writev = socket._writev.bind(socket);
    socket._write = (data: unknown, ...rest: unknown[]) => {
      writes.push(String(data));
      return write(data, ...rest);
    };
    socket._writev = (chunks: unknown, ...rest: unknown[]) => {
      writes.push((chunks as Array<{ chunk: unknown }>).map((c) => String(c.chunk)).join(""));
      return writev(chunks, ...rest);
    };
    const stream = (async function* () {
      yield* first;
      await release;
    })();
    return relayStream(req, reply, stream, new AbortController().signal);
  });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const port = (app.server.address() as { port: number }).port;
  return { app, port, writes };
}

describe("relayStream", () => {
  let app: FastifyInstance | undefined;
  // Ends the held stream, so that closing the server does not wait for it.
  let release = () => {};
  afterEach(async () => {
    release();
    await app?.close();
    app = undefined;
  });

  it("sends the status line and headers in the same write as the first event", async () => {
    const s = await serve([chunk("Hello")], new Promise<void>((r) => (release = r)));
    app = s.app;
    const firstBody = new Promise<string>((resolve, reject) => {
      request({ host: "127.0.0.1", port: s.port, path: "/stream", method: "POST" }, (res) => {
        res.setEncoding("utf8");
        res.once("data", resolve);
      })
        .on("error", reject)
        .end();
    });
    expect(await firstBody).toContain('data: {"choices":[{"delta":{"content":"Hello"}}]}');
    // One write carried both: no packet of headers alone before the first byte of the body.
    expect(s.writes[0]).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(s.writes[0]).toContain('data: {"choices":[{"delta":{"content":"Hello"}}]}');
  });

  it("sends the headers on their own when the first event writes nothing", async () => {
    // A usage-only chunk is held back until the cost is known: nothing to write with the headers.
    const usageOnly = create(StreamCompleteResponseSchema, {
      event: { case: "chunk", value: encoder.encode(JSON.stringify({ choices: [], usage: {} })) },
    });
    const s = await serve([usageOnly], new Promise<void>((r) => (release = r)));
    app = s.app;
    const status = await new Promise<number | undefined>((resolve, reject) => {
      request({ host: "127.0.0.1", port: s.port, path: "/stream", method: "POST" }, (res) => {
        resolve(res.statusCode);
        res.resume();
      })
        .on("error", reject)
        .end();
    });
    expect(status).toBe(200);
    expect(s.writes).toHaveLength(1);
  });
});
