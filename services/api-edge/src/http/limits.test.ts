import type { AddressInfo, Socket } from "node:net";
import { rawExchange } from "@tollgate/testkit/raw-http";
import Fastify, { type FastifyBaseLogger } from "fastify";
import { describe, expect, it, vi } from "vitest";
import {
  clientErrorHandler,
  DEFAULT_LIMITS,
  refuseUnroutable,
  requireHost,
  serverOptions,
} from "./limits.js";

function fakeSocket(headersSent?: boolean) {
  const written: string[] = [];
  const socket = {
    destroyed: false,
    writable: true,
    // An earlier response on this kept-alive connection wrote bytes; only the in-flight one counts.
    bytesWritten: 500,
    ...(headersSent !== undefined ? { _httpMessage: { headersSent } } : {}),
    write: (s: string) => written.push(s),
    destroy: vi.fn(),
  };
  return { socket: socket as unknown as Socket & { destroy: ReturnType<typeof vi.fn> }, written };
}

const log = { info: vi.fn() } as unknown as FastifyBaseLogger;

function answer(written: string[]) {
  const [head, body] = written.join("").split("\r\n\r\n");
  return { statusLine: head?.split("\r\n")[0], head, body: JSON.parse(body ?? "null") };
}

describe("clientErrorHandler: what the HTTP parser refuses gets the OpenAI-shaped error body", () => {
  it.each([
    ["HPE_HEADER_OVERFLOW", "HTTP/1.1 431 Request Header Fields Too Large", "headers_too_large"],
    ["ERR_HTTP_REQUEST_TIMEOUT", "HTTP/1.1 408 Request Timeout", "request_timeout"],
    ["HPE_INVALID_METHOD", "HTTP/1.1 400 Bad Request", "invalid_request"],
    ["HPE_INVALID_HEADER_TOKEN", "HTTP/1.1 400 Bad Request", "invalid_request"],
  ])("%s → %s, code %s, and the connection closes", (parserCode, statusLine, code) => {
    const { socket, written } = fakeSocket();
    clientErrorHandler(log)(Object.assign(new Error("x"), { code: parserCode }), socket);
    const a = answer(written);
    expect(a.statusLine).toBe(statusLine);
    expect(a.head).toMatch(/\r\nConnection: close/);
    expect(a.body.error).toMatchObject({ code, type: "invalid_request_error" });
    expect(a.body.error.request_id).toMatch(/^req_/);
    expect(socket.destroy).toHaveBeenCalled();
  });

  it("answers in the shape of the route the request line names: Anthropic's on /v1/messages, problem details on the paid route", () => {
    const refuse = (requestLine: string) => {
      const { socket, written } = fakeSocket();
      const rawPacket = Buffer.from(`${requestLine}\r\nHost: x\r\nX-Big: ${"a".repeat(100)}`);
      clientErrorHandler(log)(
        Object.assign(new Error("x"), { code: "HPE_HEADER_OVERFLOW", rawPacket }),
        socket,
      );
      return answer(written);
    };
    const messages = refuse("POST /v1/messages?beta=true HTTP/1.1");
    expect(messages.statusLine).toBe("HTTP/1.1 431 Request Header Fields Too Large");
    expect(messages.body).toMatchObject({ type: "error", error: { code: "headers_too_large" } });
    expect(messages.head).toMatch(new RegExp(`\r\nrequest-id: ${messages.body.request_id}\r\n`));
    const paid = refuse("POST /v1/mpp/chat/completions HTTP/1.1");
    expect(paid.head).toMatch(/\r\nContent-Type: application\/problem\+json\r\n/);
    expect(paid.body).toMatchObject({ status: 431, code: "headers_too_large" });
    const chat = refuse("POST /v1/chat/completions HTTP/1.1");
    expect(chat.body.error).toMatchObject({ code: "headers_too_large" });
    // Every answer names its request id, as every other answer does.
    expect(chat.head).toMatch(new RegExp(`\r\nx-request-id: ${chat.body.error.request_id}\r\n`));
  });

  it("answers on a kept-alive connection between responses", () => {
    const { socket, written } = fakeSocket(false);
    clientErrorHandler(log)(Object.assign(new Error("x"), { code: "HPE_INVALID_URL" }), socket);
    expect(answer(written).statusLine).toBe("HTTP/1.1 400 Bad Request");
  });

  it("writes nothing after a response has begun, and nothing to a reset connection", () => {
    const started = fakeSocket(true);
    clientErrorHandler(log)(
      Object.assign(new Error("x"), { code: "ERR_HTTP_REQUEST_TIMEOUT" }),
      started.socket,
    );
    expect(started.written).toEqual([]);
    expect(started.socket.destroy).toHaveBeenCalled();
    const reset = fakeSocket();
    clientErrorHandler(log)(Object.assign(new Error("x"), { code: "ECONNRESET" }), reset.socket);
    expect(reset.written).toEqual([]);
  });
});

describe("serverOptions", () => {
  it("gives Node and fastify the limits, and checks for slow callers often enough", () => {
    const opts = serverOptions({ ...DEFAULT_LIMITS, headersTimeoutMs: 2_000, requestTimeoutMs: 4_000 }, log);
    expect(opts).toMatchObject({
      bodyLimit: 4 * 1024 * 1024,
      requestTimeout: 4_000,
      connectionTimeout: 180_000,
      http: {
        maxHeaderSize: 16_384,
        headersTimeout: 2_000,
        requestTimeout: 4_000,
        connectionsCheckingInterval: 500,
      },
    });
    expect(serverOptions(DEFAULT_LIMITS, log).http).toMatchObject({ connectionsCheckingInterval: 1_000 });
  });
});

describe("requireHost", () => {
  it("refuses an HTTP/1.1 request without Host as invalid_request, and serves one with it", async () => {
    const app = Fastify();
    // light-my-request always sends a Host: drop it as a caller that sends none would.
    app.addHook("onRequest", async (req) => {
      if (req.headers["x-drop-host"]) delete req.headers.host;
    });
    requireHost(app);
    app.setErrorHandler((err: { code?: string }, _req, reply) => reply.code(400).send({ code: err.code }));
    app.get("/", async () => "ok");
    const without = await app.inject({ method: "GET", url: "/", headers: { "x-drop-host": "1" } });
    expect({ status: without.statusCode, body: without.json() }).toEqual({
      status: 400,
      body: { code: "invalid_request" },
    });
    expect((await app.inject({ method: "GET", url: "/", headers: { host: "x" } })).statusCode).toBe(200);
    await app.close();
  });

  it("refuses a request with two Authorization headers as invalid_request, whatever their order; one is served", async () => {
    const app = Fastify();
    requireHost(app);
    app.setErrorHandler((err: { code?: string }, _req, reply) => reply.code(400).send({ code: err.code }));
    app.get("/", async (req) => ({ authorization: req.headers.authorization }));
    await app.listen({ host: "127.0.0.1", port: 0 });
    const { port } = app.server.address() as AddressInfo;
    // Over a socket: Node's parser, not an injector, decides what a duplicate header becomes.
    const send = (lines: string[]) =>
      rawExchange(
        port,
        `GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${lines.map((l) => `${l}\r\n`).join("")}\r\n`,
      );
    try {
      for (const pair of [
        ["Authorization: Bearer tg_good", "Authorization: Payment eyJ4IjoxfQ"],
        ["authorization: Payment eyJ4IjoxfQ", "AUTHORIZATION: Bearer tg_good"],
        ["Authorization: Bearer tg_good", "Authorization: Bearer tg_other"],
      ]) {
        const answer = await send(pair);
        expect(answer).toMatch(/^HTTP\/1\.1 400 /);
        expect(answer).toContain('"code":"invalid_request"');
      }
      const one = await send(["Authorization: Bearer tg_good"]);
      expect(one).toMatch(/^HTTP\/1\.1 200 /);
      expect(one).toContain('"authorization":"Bearer tg_good"');
    } finally {
      await app.close();
    }
  });
});

describe("requireHost: several Host fields", () => {
  it("refuses a request with two Host headers as invalid_request (RFC 9112, section 3.2); one is served", async () => {
    const app = Fastify();
    requireHost(app);
    app.setErrorHandler((err: { code?: string }, _req, reply) => reply.code(400).send({ code: err.code }));
    app.get("/", async (req) => ({ host: req.headers.host }));
    await app.listen({ host: "127.0.0.1", port: 0 });
    const { port } = app.server.address() as AddressInfo;
    // Over a socket: Node keeps the first Host of several, so only the raw list shows the second.
    const send = (lines: string[]) =>
      rawExchange(
        port,
        `GET / HTTP/1.1\r\nConnection: close\r\n${lines.map((l) => `${l}\r\n`).join("")}\r\n`,
      );
    try {
      for (const pair of [
        ["Host: a.example", "Host: b.example"],
        ["Host: a.example", "HOST: a.example"],
      ]) {
        const answer = await send(pair);
        expect(answer).toMatch(/^HTTP\/1\.1 400 /);
        expect(answer).toContain('"code":"invalid_request"');
      }
      const one = await send(["Host: a.example"]);
      expect(one).toMatch(/^HTTP\/1\.1 200 /);
    } finally {
      await app.close();
    }
  });
});

describe("refuseUnroutable", () => {
  it("answers CONNECT with 400 and the usual error body, then closes, instead of dropping the connection", async () => {
    const app = Fastify();
    refuseUnroutable(app.server);
    await app.listen({ host: "127.0.0.1", port: 0 });
    try {
      const { port } = app.server.address() as AddressInfo;
      const text = await rawExchange(
        port,
        "CONNECT /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
      );
      const { statusLine, head, body } = answer([text]);
      expect(statusLine).toBe("HTTP/1.1 400 Bad Request");
      expect(head).toMatch(/\r\nx-request-id: req_/);
      expect(body.error).toMatchObject({
        code: "invalid_request",
        message: expect.stringMatching(/CONNECT/),
      });
    } finally {
      await app.close();
    }
  });

  it("answers an Expect other than 100-continue with 417 expectation_failed in its route's shape, not a bare 417", async () => {
    const app = Fastify();
    refuseUnroutable(app.server);
    app.post("/v1/chat/completions", async () => ({ ran: true }));
    await app.listen({ host: "127.0.0.1", port: 0 });
    try {
      const { port } = app.server.address() as AddressInfo;
      const ask = (path: string) =>
        rawExchange(
          port,
          `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}`,
        );
      const chat = answer([await ask("/v1/chat/completions")]);
      expect(chat.statusLine).toBe("HTTP/1.1 417 Expectation Failed");
      expect(chat.head).toMatch(/\r\nx-request-id: req_/);
      expect(chat.body.error).toMatchObject({
        code: "expectation_failed",
        message: expect.stringMatching(/200-ok/),
      });
      const messages = answer([await ask("/v1/messages")]);
      expect(messages.body).toMatchObject({ type: "error", error: { code: "expectation_failed" } });
    } finally {
      await app.close();
    }
  });
});
