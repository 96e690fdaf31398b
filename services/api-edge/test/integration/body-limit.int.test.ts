import { execFile } from "node:child_process";
import { connect } from "node:net";
import { promisify } from "node:util";
import { createLogger } from "@tollgate/kit/log";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ApiEdge, start } from "../../src/app.js";

const log = createLogger({ service: "api-edge", level: "silent" });
const MiB = 1024 * 1024;
let edge: ApiEdge;
let url: string;

beforeAll(async () => {
  // Nothing behind it answers, which an oversized body never reaches. The default 4 MiB limit.
  edge = await start(
    {
      host: "127.0.0.1",
      port: 0,
      authPolicyAddr: "127.0.0.1:1",
      inferenceRouterAddr: "127.0.0.1:1",
      mppPaymentAddr: "127.0.0.1:1",
    },
    log,
  );
  url = `http://127.0.0.1:${edge.port}/v1/chat/completions`;
});

afterAll(async () => {
  await edge?.stop();
});

/** What the client process saw of one request: the answer, or the error fetch threw. */
interface Outcome {
  status?: number;
  requestIdHeader?: string | null;
  contentType?: string | null;
  body?: { error?: Record<string, unknown> };
  error?: string;
}

/**
 * Node's global fetch (undici, which the openai SDK uses too) in a process of its own: with
 * client and server on one event loop the server's reset never races the client's reading,
 * and the failure this guards against does not show.
 */
const CLIENT = `
const { url, count, bytes, chunked } = JSON.parse(process.env.CLIENT_ARGS);
const outcomes = [];
for (let i = 0; i < count; i++) {
  try {
    let body;
    if (chunked) {
      let sent = 0;
      body = new ReadableStream({
        pull(c) {
          if (sent >= bytes) return c.close();
          sent += 262144;
          c.enqueue(new Uint8Array(262144).fill(32));
        },
      });
    } else {
      body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(bytes) }] });
    }
    const res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
      duplex: "half",
      signal: AbortSignal.timeout(20000),
    });
    outcomes.push({
      status: res.status,
      requestIdHeader: res.headers.get("x-request-id"),
      contentType: res.headers.get("content-type"),
      body: await res.json(),
    });
  } catch (e) {
    outcomes.push({ error: String(e?.cause?.code ?? e?.cause ?? e) });
  }
}
process.stdout.write(JSON.stringify(outcomes));
`;

async function postFromAnotherProcess(args: {
  count: number;
  bytes: number;
  chunked: boolean;
}): Promise<Outcome[]> {
  const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", CLIENT], {
    env: { ...process.env, CLIENT_ARGS: JSON.stringify({ url, ...args }) },
    timeout: 120_000,
    maxBuffer: 1024 * 1024,
  });
  return JSON.parse(stdout) as Outcome[];
}

/** Each outcome is a 413 with the OpenAI-shaped error body and its request id. */
function expectAll413(outcomes: Outcome[], count: number): void {
  expect(outcomes.map((o) => o.status ?? o.error)).toEqual(Array(count).fill(413));
  for (const o of outcomes) {
    expect(o.contentType).toContain("application/json");
    expect(o.requestIdHeader).toBeTruthy();
    expect(o.body?.error).toMatchObject({
      type: "invalid_request_error",
      code: "payload_too_large",
      message: expect.any(String),
      request_id: o.requestIdHeader,
    });
  }
}

/**
 * Sends a POST declaring `bytes` of body over a raw socket and writes all of it (waiting for
 * the socket to take each chunk), then reads until the server closes. `writeError` is the
 * error the writing met, if any: a server that closed without reading the body resets it.
 */
function rawPost(port: number, bytes: number): Promise<{ writeError?: string; response: string }> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    let response = "";
    let writeError: string | undefined;
    const guard = setTimeout(() => socket.destroy(), 20_000);
    socket.setEncoding("latin1");
    socket.on("data", (d: string) => {
      response += d;
    });
    socket.on("error", (e: NodeJS.ErrnoException) => {
      writeError = e.code ?? e.message;
    });
    socket.on("close", () => {
      clearTimeout(guard);
      resolve({ ...(writeError ? { writeError } : {}), response });
    });
    socket.on("connect", async () => {
      socket.write(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
          `Content-Length: ${bytes}\r\n\r\n`,
      );
      const chunk = Buffer.alloc(64 * 1024, 0x20);
      for (let sent = 0; sent < bytes && !socket.destroyed; sent += chunk.length) {
        const part = sent + chunk.length <= bytes ? chunk : chunk.subarray(0, bytes - sent);
        await new Promise<void>((done) => {
          if (socket.write(part)) return done();
          socket.once("drain", done);
          socket.once("close", done);
        });
      }
    });
  });
}

describe("api-edge oversized bodies", () => {
  it("answers ten sequential 6 MiB posts from Node's fetch in another process, each with its 413 and the error body", async () => {
    expectAll413(await postFromAnotherProcess({ count: 10, bytes: 6 * MiB, chunked: false }), 10);
  }, 120_000);

  it("answers oversized chunked bodies (no Content-Length) from Node's fetch with their 413", async () => {
    expectAll413(await postFromAnotherProcess({ count: 3, bytes: 6 * MiB, chunked: true }), 3);
  }, 120_000);

  it("reads the whole oversized body before answering, so a caller that writes all of it is never reset", async () => {
    for (let i = 0; i < 3; i++) {
      const { writeError, response } = await rawPost(edge.port, 6 * MiB);
      expect(writeError).toBeUndefined();
      expect(response).toMatch(/^HTTP\/1\.1 413 /);
      expect(response).toContain('"code":"payload_too_large"');
    }
  });

  it("answers at once, without reading, a body declared above the drain bound (four times the limit)", async () => {
    const started = performance.now();
    const res = await new Promise<string>((resolve) => {
      const socket = connect(edge.port, "127.0.0.1");
      let response = "";
      socket.setEncoding("latin1");
      socket.on("data", (d: string) => {
        response += d;
      });
      socket.on("error", () => {});
      socket.on("close", () => resolve(response));
      socket.write(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
          `Content-Length: ${16 * MiB + 1}\r\n\r\n`,
      );
    });
    expect(res).toMatch(/^HTTP\/1\.1 413 /);
    expect(res.toLowerCase()).toContain("connection: close");
    expect(performance.now() - started).toBeLessThan(5_000);
  });
});

describe("api-edge and Expect: 100-continue", () => {
  /** Sends only the headers, as curl does for a large body, and reads until the server closes or `ms` pass. */
  const headersOnly = (path: string, length: number, ms = 3_000) =>
    new Promise<string>((resolve) => {
      const socket = connect(edge.port, "127.0.0.1");
      let response = "";
      socket.setEncoding("latin1");
      socket.on("data", (d: string) => {
        response += d;
      });
      socket.on("error", () => {});
      const guard = setTimeout(() => socket.destroy(), ms);
      socket.on("close", () => {
        clearTimeout(guard);
        resolve(response);
      });
      socket.write(
        `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
          `Expect: 100-continue\r\nContent-Length: ${length}\r\n\r\n`,
      );
    });

  it("answers a body declared above the limit with its 413 at once, never inviting it with 100 Continue", async () => {
    for (const [path, type] of [
      ["/v1/chat/completions", "application/json"],
      ["/v1/mpp/chat/completions", "application/problem+json"],
    ] as const) {
      for (const length of [6 * MiB, 20 * MiB]) {
        const started = performance.now();
        const res = await headersOnly(path, length);
        expect(res, `${path} ${length}`).toMatch(/^HTTP\/1\.1 413 /);
        expect(res).not.toContain("100 Continue");
        expect(res.toLowerCase()).toContain(`content-type: ${type}`);
        expect(res.toLowerCase()).toContain("x-request-id: ");
        expect(res.toLowerCase()).toContain("connection: close");
        expect(res).toContain("payload_too_large");
        expect(performance.now() - started).toBeLessThan(2_000);
      }
    }
  });

  it("still invites a body within the limit with 100 Continue", async () => {
    const res = await headersOnly("/v1/chat/completions", 1024, 500);
    expect(res).toMatch(/^HTTP\/1\.1 100 Continue\r\n/);
  });
});

describe("api-edge oversized bodies beyond the drain bound", () => {
  it("stops reading an endless chunked body at four times the limit and closes the connection", async () => {
    const small = await start(
      {
        host: "127.0.0.1",
        port: 0,
        authPolicyAddr: "127.0.0.1:1",
        inferenceRouterAddr: "127.0.0.1:1",
        limits: { bodyLimitBytes: 64 * 1024 },
      },
      log,
    );
    try {
      const started = performance.now();
      const closedAfter = await new Promise<number>((resolve) => {
        const socket = connect(small.port, "127.0.0.1");
        const guard = setTimeout(() => socket.destroy(), 20_000);
        socket.on("error", () => {});
        socket.on("close", () => {
          clearTimeout(guard);
          resolve(performance.now() - started);
        });
        socket.on("connect", async () => {
          socket.write(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
              "Transfer-Encoding: chunked\r\n\r\n",
          );
          const chunk = Buffer.concat([
            Buffer.from("10000\r\n"),
            Buffer.alloc(0x10000, 0x20),
            Buffer.from("\r\n"),
          ]);
          // Never ends the body: only the server can end this.
          while (!socket.destroyed) {
            await new Promise<void>((done) => {
              if (socket.write(chunk)) return setImmediate(done);
              socket.once("drain", done);
              socket.once("close", done);
            });
          }
        });
      });
      // Far below the 60 s request timeout, which would end it otherwise.
      expect(closedAfter).toBeLessThan(10_000);
    } finally {
      await small.stop();
    }
  });
});
