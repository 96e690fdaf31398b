// What one call between two processes costs in CPU, by transport, with no gateway logic: the floor
// under the stack's api-edge → inference-router hop (docs/performance.md, "What holds the stack
// back" and "Our own gRPC client"). A client process sends a 900-byte request and reads a
// 600-byte answer, over grpc-js unary (raw bytes, no protobuf; grpc-js client and server), the
// gateway's own client (packages/kit/src/channel.ts) calling the same grpc-js server, the
// gateway's own client and server (`kit`: channel.ts and grpc-server.ts), Node's own http2 (the
// same bytes, no gRPC framing) and http keep-alive; it prints calls/s and the CPU of client and
// server per call.
//
//   flock /tmp/bench.lock node --import tsx bench/transport-floor.ts [--in-flight 50] [--calls 20000]
//
// Everything stays on 127.0.0.1; each transport runs after a warm-up of 3,000 calls.
import { type ChildProcess, fork } from "node:child_process";
import * as http from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { parseArgs } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { Channel } from "@tollgate/kit/channel";
import { GrpcHttp2Server } from "@tollgate/kit/grpc-server";

const TRANSPORTS = ["grpc-js", "channel", "kit", "http2", "http"] as const;
type Transport = (typeof TRANSPORTS)[number];
const REQUEST = Buffer.alloc(900, 97);
const ANSWER = Buffer.alloc(600, 120);
const bytes = (b: Buffer) => b;
const METHOD = {
  path: "/floor.Floor/Call",
  requestStream: false,
  responseStream: false,
  requestSerialize: bytes,
  requestDeserialize: bytes,
  responseSerialize: bytes,
  responseDeserialize: bytes,
};

/** The server side, in the child process: listens on a free port, reports it, then its CPU on request. */
async function serve(transport: Transport): Promise<void> {
  let port: number;
  if (transport === "grpc-js" || transport === "channel") {
    const server = new grpc.Server();
    server.addService(
      { Call: METHOD },
      { Call: (_call: unknown, cb: grpc.sendUnaryData<Buffer>) => cb(null, ANSWER) },
    );
    port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) =>
        err ? reject(err) : resolve(p),
      ),
    );
  } else if (transport === "kit") {
    const server = new GrpcHttp2Server();
    server.register(METHOD.path, (call) => call.answer(ANSWER));
    port = await server.listen("127.0.0.1", 0);
  } else {
    const server =
      transport === "http2"
        ? http2.createServer().on("stream", (stream) => {
            stream.on("data", () => {});
            stream.on("end", () => {
              stream.respond({ ":status": 200, "content-type": "application/octet-stream" });
              stream.end(ANSWER);
            });
          })
        : http.createServer((req, res) => {
            req.on("data", () => {});
            req.on("end", () => {
              res.writeHead(200, {
                "content-type": "application/octet-stream",
                "content-length": ANSWER.length,
              });
              res.end(ANSWER);
            });
          });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  }
  process.on("message", () => process.send?.(process.cpuUsage()));
  process.send?.(port);
}

/** One call of the transport, as a function returning when the whole answer is read. */
function caller(transport: Transport, port: number, inFlight: number): () => Promise<unknown> {
  if (transport === "grpc-js") {
    const Client = grpc.makeGenericClientConstructor({ Call: METHOD }, "Floor");
    const client = new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure()) as unknown as {
      Call(req: Buffer, cb: (err: Error | null, res?: Buffer) => void): void;
    };
    return () =>
      new Promise((resolve, reject) =>
        client.Call(REQUEST, (err, res) => (err ? reject(err) : resolve(res))),
      );
  }
  if (transport === "channel" || transport === "kit") {
    const channel = new Channel(`127.0.0.1:${port}`);
    return () => channel.unary({ path: METHOD.path, metadata: {} }, REQUEST);
  }
  const read = (res: NodeJS.ReadableStream, resolve: (v: unknown) => void, reject: (e: Error) => void) => {
    const chunks: Buffer[] = [];
    res.on("data", (d: Buffer) => chunks.push(d));
    res.on("end", () => resolve(Buffer.concat(chunks)));
    res.on("error", reject);
  };
  if (transport === "http2") {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    return () =>
      new Promise((resolve, reject) => {
        const stream = session.request({
          ":method": "POST",
          ":path": "/call",
          "content-type": "application/octet-stream",
        });
        read(stream, resolve, reject);
        stream.end(REQUEST);
      });
  }
  const agent = new http.Agent({ keepAlive: true, maxSockets: inFlight });
  const headers = { "content-type": "application/octet-stream", "content-length": REQUEST.length };
  return () =>
    new Promise((resolve, reject) => {
      const req = http.request(
        { host: "127.0.0.1", port, method: "POST", path: "/call", agent, headers },
        (res) => read(res, resolve, reject),
      );
      req.on("error", reject);
      req.end(REQUEST);
    });
}

const ask = <T>(child: ChildProcess, message?: string) =>
  new Promise<T>((resolve) => {
    child.once("message", (m) => resolve(m as T));
    if (message) child.send(message);
  });

async function measure(transport: Transport, inFlight: number, calls: number): Promise<string> {
  const child = fork(new URL(import.meta.url), [], {
    env: { ...process.env, FLOOR_SERVE: transport },
    execArgv: process.execArgv,
  });
  try {
    const port = await ask<number>(child);
    const call = caller(transport, port, inFlight);
    const run = async (n: number) => {
      let started = 0;
      await Promise.all(
        Array.from({ length: inFlight }, async () => {
          while (started++ < n) await call();
        }),
      );
    };
    await run(3_000);
    const server0 = await ask<NodeJS.CpuUsage>(child, "cpu");
    const client0 = process.cpuUsage();
    const t0 = performance.now();
    await run(calls);
    const seconds = (performance.now() - t0) / 1000;
    const client = process.cpuUsage(client0);
    const server1 = await ask<NodeJS.CpuUsage>(child, "cpu");
    const us = (c: { user: number; system: number }) => (c.user + c.system) / calls;
    const serverUs = us({ user: server1.user - server0.user, system: server1.system - server0.system });
    return `| ${transport} | ${inFlight} | ${Math.round(calls / seconds)} | ${us(client).toFixed(0)} | ${serverUs.toFixed(0)} | ${(us(client) + serverUs).toFixed(0)} |`;
  } finally {
    child.kill();
  }
}

const served = process.env["FLOOR_SERVE"] as Transport | undefined;
if (served) {
  await serve(served);
} else {
  const { values } = parseArgs({
    options: { "in-flight": { type: "string", default: "50" }, calls: { type: "string", default: "20000" } },
  });
  const inFlight = Number(values["in-flight"]);
  const calls = Number(values.calls);
  console.log("| transport | calls in flight | calls/s | client µs/call | server µs/call | both µs/call |");
  console.log("|---|---:|---:|---:|---:|---:|");
  for (const t of TRANSPORTS) console.log(await measure(t, inFlight, calls));
  process.exit(0);
}
