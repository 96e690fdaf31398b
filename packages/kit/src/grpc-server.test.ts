import * as http2 from "node:http2";
import { connect } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { afterEach, describe, expect, it } from "vitest";
import { Channel } from "./channel.js";
import { GrpcHttp2Server, type ServerCall } from "./grpc-server.js";
import { frame } from "./grpc-wire.js";
import { RemoteError } from "./remote-error.js";

const bytes = (b: Buffer) => b;
const method = (path: string, responseStream = false) => ({
  path,
  requestStream: false,
  responseStream,
  requestSerialize: bytes,
  requestDeserialize: bytes,
  responseSerialize: bytes,
  responseDeserialize: bytes,
});
const ECHO = "/test.Test/Echo";
const HANG = "/test.Test/Hang";
const COUNT = "/test.Test/Count";
const LATER = "/test.Test/Later";

let server: GrpcHttp2Server | undefined;
const closers: Array<() => void> = [];
afterEach(async () => {
  for (const close of closers.splice(0)) close();
  await server?.shutdown(100);
  server = undefined;
});

/** A server with an echo, a call that never answers (its cancels counted) and a 3-message stream. */
async function start(): Promise<{ port: number; cancels: string[] }> {
  const cancels: string[] = [];
  server = new GrpcHttp2Server();
  server.register(ECHO, (call) => call.answer(Buffer.concat([Buffer.from("echo:"), call.request])));
  server.register(HANG, (call: ServerCall) => call.onCancel(() => cancels.push(call.request.toString())));
  server.register(LATER, (call) => {
    setTimeout(() => call.answer(call.request), 50);
  });
  server.register(COUNT, (call) => {
    for (let i = 0; i < 3; i++) call.write(Buffer.from(String(i)));
    call.end();
  });
  return { port: await server.listen("127.0.0.1", 0), cancels };
}

/** A grpc-js client (an independent implementation of the protocol) for the test methods. */
function grpcJsClient(port: number) {
  const Client = grpc.makeGenericClientConstructor(
    { Echo: method(ECHO), Hang: method(HANG), Count: method(COUNT, true) },
    "Test",
  );
  const client = new Client(
    `127.0.0.1:${port}`,
    grpc.credentials.createInsecure(),
  ) as unknown as grpc.Client & {
    Echo(
      req: Buffer,
      opts: grpc.CallOptions,
      cb: (err: grpc.ServiceError | null, res?: Buffer) => void,
    ): void;
    Hang(
      req: Buffer,
      opts: grpc.CallOptions,
      cb: (err: grpc.ServiceError | null, res?: Buffer) => void,
    ): void;
    Count(req: Buffer): grpc.ClientReadableStream<Buffer>;
  };
  closers.push(() => client.close());
  const unary = (name: "Echo" | "Hang", req: string, opts: grpc.CallOptions = {}) =>
    new Promise<Buffer>((resolve, reject) =>
      client[name](Buffer.from(req), opts, (err, res) => (err ? reject(err) : resolve(res!))),
    );
  return { client, unary };
}

/** Sends one raw HTTP/2 request and reads the status it ends with (headers or trailers). */
function raw(
  port: number,
  headers: http2.OutgoingHttpHeaders,
  body: Buffer,
): Promise<Record<string, unknown>> {
  const session = http2.connect(`http://127.0.0.1:${port}`);
  closers.push(() => session.destroy());
  return new Promise((resolve, reject) => {
    const stream = session.request({
      ":method": "POST",
      ":path": ECHO,
      "content-type": "application/grpc",
      ...headers,
    });
    let head: http2.IncomingHttpHeaders = {};
    stream.on("response", (h) => {
      head = h;
    });
    stream.on("trailers", (t) => {
      head = { ...head, ...t };
    });
    stream.on("data", () => {});
    stream.on("close", () => resolve(head));
    stream.on("error", reject);
    stream.end(body);
  });
}

describe("the gateway's gRPC server", () => {
  it("answers a grpc-js client: unary, server stream, and UNIMPLEMENTED for an unknown method", async () => {
    const { port } = await start();
    const { client, unary } = grpcJsClient(port);
    expect((await unary("Echo", "hi")).toString()).toBe("echo:hi");
    const messages: string[] = [];
    for await (const m of client.Count(Buffer.from("x"))) messages.push((m as Buffer).toString());
    expect(messages).toEqual(["0", "1", "2"]);
    const channel = new Channel(`127.0.0.1:${port}`);
    closers.push(() => channel.close());
    await expect(
      channel.unary({ path: "/test.Test/Nope", metadata: {} }, Buffer.from("")),
    ).rejects.toMatchObject({
      status: grpc.status.UNIMPLEMENTED,
    });
  });

  it("answers malformed calls with a status and keeps serving", async () => {
    const { port } = await start();
    const compressed = frame(Buffer.from("x"));
    compressed[0] = 1;
    const tooLarge = Buffer.alloc(5);
    tooLarge.writeUInt32BE(64 * 1024 * 1024, 1);
    const two = Buffer.concat([frame(Buffer.from("a")), frame(Buffer.from("b"))]);
    expect((await raw(port, {}, compressed))["grpc-status"]).toBe(String(grpc.status.INTERNAL));
    expect((await raw(port, {}, tooLarge))["grpc-status"]).toBe(String(grpc.status.RESOURCE_EXHAUSTED));
    expect((await raw(port, {}, two))["grpc-status"]).toBe(String(grpc.status.INTERNAL));
    expect((await raw(port, {}, Buffer.alloc(0)))["grpc-status"]).toBe(String(grpc.status.INTERNAL));
    expect((await raw(port, {}, Buffer.from([0, 0, 0])))["grpc-status"]).toBe(String(grpc.status.INTERNAL));
    expect((await raw(port, { "content-type": "text/plain" }, frame(Buffer.from("x"))))[":status"]).toBe(415);
    expect((await raw(port, { "grpc-encoding": "gzip" }, frame(Buffer.from("x"))))["grpc-status"]).toBe(
      String(grpc.status.UNIMPLEMENTED),
    );
    const { unary } = grpcJsClient(port);
    expect((await unary("Echo", "still")).toString()).toBe("echo:still");
  });

  it("answers 300 random request bodies and headers with a status each, then still serves", async () => {
    const { port } = await start();
    let seed = 42;
    const random = (n: number) => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
      return seed % n;
    };
    const paths = [ECHO, LATER, COUNT, "/test.Test/Nope", "/", "/test.Test/Echo/extra"];
    const timeouts = [undefined, "1m", "0n", "99999999H", "abc", "-5S", "1"];
    for (let i = 0; i < 300; i++) {
      const body = Buffer.alloc(random(64));
      for (let j = 0; j < body.length; j++) body[j] = random(256);
      if (random(2) === 0 && body.length >= 5) {
        body[0] = random(3);
        body.writeUInt32BE(random(2) === 0 ? body.length - 5 : random(2 ** 31), 1);
      }
      const headers: http2.OutgoingHttpHeaders = { ":path": paths[random(paths.length)]! };
      const timeout = timeouts[random(timeouts.length)];
      if (timeout !== undefined) headers["grpc-timeout"] = timeout;
      if (random(4) === 0) headers["grpc-encoding"] = random(2) === 0 ? "identity" : "deflate";
      const answer = await raw(port, headers, body);
      const status = answer["grpc-status"] ?? answer[":status"];
      expect(status, `call ${i}`).toBeDefined();
    }
    const { unary } = grpcJsClient(port);
    expect((await unary("Echo", "alive")).toString()).toBe("echo:alive");
  }, 30_000);

  it("ends a call at its deadline with DEADLINE_EXCEEDED, and tells the handler", async () => {
    const { port, cancels } = await start();
    const { unary } = grpcJsClient(port);
    const started = Date.now();
    await expect(unary("Hang", "late", { deadline: Date.now() + 200 })).rejects.toMatchObject({
      code: grpc.status.DEADLINE_EXCEEDED,
    });
    expect(Date.now() - started).toBeLessThan(2_000);
    await new Promise((r) => setTimeout(r, 50));
    expect(cancels).toEqual(["late"]);
  });

  it("serves a call whose deadline is beyond a timer's range (99999999 hours) as one without", async () => {
    const { port } = await start();
    const answer = await raw(
      port,
      { ":path": LATER, "grpc-timeout": "99999999H" },
      frame(Buffer.from("far")),
    );
    expect(answer["grpc-status"]).toBe("0");
  });

  it("tells the handler when the caller cancels", async () => {
    const { port, cancels } = await start();
    const channel = new Channel(`127.0.0.1:${port}`);
    closers.push(() => channel.close());
    const abort = new AbortController();
    const call = channel.unary({ path: HANG, metadata: {}, signal: abort.signal }, Buffer.from("gone"));
    await new Promise((r) => setTimeout(r, 100));
    abort.abort();
    await expect(call).rejects.toBeInstanceOf(RemoteError);
    await new Promise((r) => setTimeout(r, 50));
    expect(cancels).toEqual(["gone"]);
  });

  it("lets a call in flight finish on shutdown, and takes no new connection", async () => {
    server = new GrpcHttp2Server();
    let release: () => void = () => {};
    server.register(HANG, (call) => {
      release = () => call.answer(Buffer.from("done"));
    });
    const port = await server.listen("127.0.0.1", 0);
    const { unary } = grpcJsClient(port);
    const held = unary("Hang", "x");
    await new Promise((r) => setTimeout(r, 100));
    const stopped = server.shutdown(5_000);
    await new Promise((r) => setTimeout(r, 50));
    release();
    expect((await held).toString()).toBe("done");
    await stopped;
    server = undefined;
    await expect(
      new Promise((resolve, reject) => connect(port, "127.0.0.1").on("connect", resolve).on("error", reject)),
    ).rejects.toThrow(/ECONNREFUSED/);
  });

  it("ends the calls still open when the grace is over with UNAVAILABLE and a status, and tells their handlers", async () => {
    server = new GrpcHttp2Server();
    const told: string[] = [];
    server.register(HANG, (call) => call.onCancel(() => told.push("unary")));
    server.register(COUNT, (call) => {
      call.write(Buffer.from("first"));
      call.onCancel(() => told.push("stream"));
    });
    const port = await server.listen("127.0.0.1", 0);
    const channel = new Channel(`127.0.0.1:${port}`);
    closers.push(() => channel.close());
    const unary = channel.unary({ path: HANG, metadata: {} }, Buffer.from("x")).catch((e: unknown) => e);
    const received: string[] = [];
    const streamed = (async () => {
      for await (const m of channel.serverStream({ path: COUNT, metadata: {} }, Buffer.from("x")))
        received.push(m.toString());
    })().catch((e: unknown) => e);
    // The same stream read raw: its status arrives as trailers after the message.
    const session = http2.connect(`http://127.0.0.1:${port}`);
    closers.push(() => session.destroy());
    const rawStream = session.request({
      ":method": "POST",
      ":path": COUNT,
      "content-type": "application/grpc",
    });
    let rawBytes = 0;
    rawStream.on("data", (d: Buffer) => {
      rawBytes += d.length;
    });
    const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => rawStream.on("trailers", resolve));
    const rawClosed = new Promise((resolve) => rawStream.on("close", resolve));
    rawStream.end(frame(Buffer.from("x")));
    while (received.length < 1 || rawBytes < 1) await new Promise((r) => setTimeout(r, 10));

    await server.shutdown(100);
    server = undefined;
    const stopping = { status: grpc.status.UNAVAILABLE, message: "the server is stopping" };
    expect(await unary).toMatchObject(stopping);
    expect(await streamed).toMatchObject(stopping);
    expect(received).toEqual(["first"]);
    await rawClosed;
    expect(rawStream.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
    expect(await trailers).toMatchObject({ "grpc-status": String(grpc.status.UNAVAILABLE) });
    expect(told.sort()).toEqual(["stream", "stream", "unary"]);
  });

  it("waits for a slow caller to read a stream, and ends the handler when that caller goes away", async () => {
    server = new GrpcHttp2Server();
    const finished: Array<{ sent: number; cancelled: boolean }> = [];
    const message = Buffer.alloc(64 * 1024, 7);
    server.register(COUNT, (call) => {
      void (async () => {
        let sent = 0;
        for (; sent < 200 && !call.cancelled; sent++) if (!call.write(message)) await call.drained();
        call.end();
        finished.push({ sent, cancelled: call.cancelled });
      })();
    });
    const port = await server.listen("127.0.0.1", 0);
    const session = http2.connect(`http://127.0.0.1:${port}`);
    closers.push(() => session.destroy());
    const request = () =>
      session
        .request({ ":method": "POST", ":path": COUNT, "content-type": "application/grpc" })
        .end(frame(Buffer.from("x")));

    // Read slowly: pause, then take everything.
    const slow = request();
    slow.pause();
    await new Promise((r) => setTimeout(r, 200));
    expect(finished).toEqual([]);
    let bytes = 0;
    slow.on("data", (d: Buffer) => {
      bytes += d.length;
    });
    slow.resume();
    await new Promise((r) => slow.on("close", r));
    expect(bytes).toBe(200 * (5 + message.length));
    expect(finished).toEqual([{ sent: 200, cancelled: false }]);

    // Read nothing, then go away: the handler, parked on a full stream, ends.
    const gone = request();
    gone.pause();
    await new Promise((r) => setTimeout(r, 200));
    gone.close(http2.constants.NGHTTP2_CANCEL);
    for (let i = 0; i < 50 && finished.length < 2; i++) await new Promise((r) => setTimeout(r, 20));
    expect(finished[1]?.cancelled).toBe(true);
    expect(finished[1]!.sent).toBeLessThan(200);
  });
});
