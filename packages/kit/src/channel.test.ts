import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { decodeMessage, encodeMessage } from "@tollgate/proto/codec";
import { CompleteRequestSchema, CompleteResponseSchema, InferenceService } from "@tollgate/proto/inference";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { Channel } from "./channel.js";
import { childScript, outputOf } from "./child-script.js";
import {
  addService,
  bindServer,
  createClient,
  createServer,
  GrpcStatus,
  RemoteError,
  StatusError,
} from "./grpc.js";
import type { GrpcHttp2Server as Server } from "./grpc-server.js";

const decoder = new TextDecoder();
const servers: Server[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.forceShutdown();
});
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A replica: answers Complete with its name after `delayMs`, or UNAVAILABLE while `failing`; a
 * call for the model "hold" waits until `release()`. Bound to `host`:`port` (default a free
 * port on 127.0.0.1).
 */
async function replica(name: string, opts: { delayMs?: number; host?: string; port?: number } = {}) {
  let release = () => {};
  const held = new Promise<void>((r) => {
    release = r;
  });
  const state = { failing: false, calls: 0, release };
  const server = createServer();
  addService(
    server,
    InferenceService,
    {
      async complete(req) {
        state.calls++;
        if (state.failing) throw new StatusError(GrpcStatus.UNAVAILABLE, "unavailable", "not now");
        if (req.input?.model === "hold") await held;
        if (opts.delayMs) await sleep(opts.delayMs);
        return { body: new TextEncoder().encode(name) };
      },
      async *streamComplete() {},
    },
    pino({ level: "silent" }),
  );
  const port = await bindServer(server, opts.host ?? "127.0.0.1", opts.port ?? 0);
  servers.push(server);
  return { name, port, server, state };
}

/** Replicas "a" and "b" and a client of both (a comma list), connected. */
async function twoReplicas(opts: { delayMs?: number } = {}) {
  const a = await replica("a", opts);
  const b = await replica("b", opts);
  const client = createClient(InferenceService, `127.0.0.1:${a.port},127.0.0.1:${b.port}`);
  // Both connections up before the first call, as a running api-edge has them.
  await client.$ready(5_000);
  await sleep(100);
  const call = async () => {
    try {
      return decoder.decode((await client.complete({})).body);
    } catch {
      return "failed";
    }
  };
  return { a, b, client, call };
}

describe("spreading calls over replicas (fewest in flight)", () => {
  it("sends calls made one at a time to one replica, which stays warm", async () => {
    const { client, call } = await twoReplicas();
    const served: string[] = [];
    for (let i = 0; i < 20; i++) served.push(await call());
    client.$close();
    // Round-robin alternated a, b, a, b: each replica woke for every other call. (The preferred
    // replica may move once within the 20 calls.)
    const switches = served.filter((s, i) => i > 0 && s !== served[i - 1]).length;
    expect(switches).toBeLessThanOrEqual(1);
  });

  it("spreads calls that overlap over both replicas, evenly", async () => {
    const { client, call } = await twoReplicas({ delayMs: 30 });
    const served = await Promise.all(Array.from({ length: 20 }, call));
    client.$close();
    const count = (n: string) => served.filter((s) => s === n).length;
    expect(count("a")).toBe(10);
    expect(count("b")).toBe(10);
  });

  it("moves calls to the other replica when the preferred one stops", async () => {
    const { a, b, client, call } = await twoReplicas();
    const home = (await call()) === "a" ? a : b;
    const other = home === a ? b : a;
    home.server.forceShutdown();
    await sleep(200);
    const served: string[] = [];
    for (let i = 0; i < 5; i++) served.push(await call());
    client.$close();
    expect(served).toEqual(Array(5).fill(other.name));
  });

  it("passes over a replica that answers UNAVAILABLE while the other serves", async () => {
    const { a, b, client, call } = await twoReplicas();
    const home = (await call()) === "a" ? a : b;
    const other = home === a ? b : a;
    home.state.failing = true;
    const served: string[] = [];
    for (let i = 0; i < 10; i++) served.push(await call());
    client.$close();
    // One call meets the failure; the next ones go to the replica that answers.
    expect(served[0]).toBe("failed");
    expect(served.slice(1)).toEqual(Array(9).fill(other.name));
    expect(home.state.calls).toBe(2);
  });
});

/** A channel with `backoffFirstMs`, connected to replica "a", which is then gone. */
async function connectedThenGone(backoffFirstMs: number) {
  const a = await replica("a");
  const channel = new Channel(`127.0.0.1:${a.port}`, { backoffFirstMs });
  await channel.ready(5_000);
  a.server.forceShutdown();
  return { a, channel };
}

/** One Complete call straight on `channel`. */
const completeOn = (channel: Channel) =>
  channel.unary(
    { path: `/${InferenceService.typeName}/Complete`, metadata: {} },
    encodeMessage(CompleteRequestSchema, {}) as Uint8Array,
  );

describe("connections", () => {
  it("fails a call whose server dies mid-call as UNAVAILABLE (not CANCELLED), then serves again after a restart on the same port", async () => {
    const a = await replica("a");
    const client = createClient(InferenceService, `127.0.0.1:${a.port}`);
    await client.$ready(5_000);
    const held = client.complete({ input: { model: "hold" } }).catch((e: unknown) => e);
    while (a.state.calls < 1) await sleep(5);
    a.server.forceShutdown();
    const err = await held;
    expect(err).toBeInstanceOf(RemoteError);
    expect((err as RemoteError).status).toBe(GrpcStatus.UNAVAILABLE);
    // Nothing listens: a call fails at once, UNAVAILABLE, instead of hanging.
    const refused = await client.complete({}).catch((e: unknown) => e);
    expect((refused as RemoteError).status).toBe(GrpcStatus.UNAVAILABLE);
    // The same address comes back (a restarted pod): the backoff's next try reconnects.
    await replica("a2", { port: a.port });
    await client.$ready(5_000);
    expect(decoder.decode((await client.complete({})).body)).toBe("a2");
    client.$close();
  });

  it("reconnects within a second of a long-gone replica's return when calls find it away, not after the grown backoff", async () => {
    // Backoffs from 200 ms: 0.2, 0.32, 0.51, 0.82, 1.3, 2.1, 3.4 s… so after 5.5 s away the
    // next scheduled try is at least 2.4 s off.
    const { a, channel } = await connectedThenGone(200);
    await sleep(5_500);
    await replica("a2", { port: a.port });
    const back = performance.now();
    let servedAfter: number | undefined;
    while (performance.now() - back < 5_000) {
      const ok = await completeOn(channel).then(
        () => true,
        () => false,
      );
      if (ok) {
        servedAfter = performance.now() - back;
        break;
      }
      await sleep(50);
    }
    expect(servedAfter).toBeDefined();
    expect(servedAfter!).toBeLessThan(1_800);
    channel.close();
  }, 15_000);

  it("serves the call that finds a replica back whose last try is a second old, connecting for it at once", async () => {
    // The first retry after the loss is 4–6 s off.
    const { a, channel } = await connectedThenGone(5_000);
    await sleep(200);
    // Away: a call fails fast, UNAVAILABLE.
    const started = performance.now();
    const away = await completeOn(channel).catch((e: unknown) => e);
    expect((away as RemoteError).status).toBe(GrpcStatus.UNAVAILABLE);
    expect(performance.now() - started).toBeLessThan(1_000);
    await sleep(1_100);
    await replica("a2", { port: a.port });
    // Back, its next try seconds off: the first call connects and is served.
    const ok = decodeMessage(CompleteResponseSchema, await completeOn(channel));
    expect(decoder.decode(ok.body)).toBe("a2");
    channel.close();
  });

  it("lets a call in flight finish when its server drains, and sends new calls to another replica", async () => {
    const { a, b, client, call } = await twoReplicas();
    const home = (await call()) === "a" ? a : b;
    const other = home === a ? b : a;
    const held = client.complete({ input: { model: "hold" } });
    while (home.state.calls < 2) await sleep(5);
    // A drain: GOAWAY, no new calls, calls in flight finish.
    const drained = home.server.shutdown(60_000);
    await sleep(100);
    expect(await call()).toBe(other.name);
    home.state.release();
    expect(decoder.decode((await held).body)).toBe(home.name);
    await drained;
    client.$close();
  });

  it("keeps each replica's calls in flight counted when its name is looked up again", async () => {
    // Two replicas on one port, as pods behind a Kubernetes headless Service: 127.0.0.1 and
    // 127.0.0.2 are both loopback.
    const a = await replica("a");
    const b = await replica("b", { host: "127.0.0.2", port: a.port });
    let lookups = 0;
    const channel = new Channel(`dns:///replicas.test:${a.port}`, {
      lookup: async () => {
        lookups++;
        return ["127.0.0.1", "127.0.0.2"];
      },
      // Looked up again before every call.
      resolveMs: 0,
    });
    await channel.ready(5_000);
    await sleep(100);
    const request = (model: string) =>
      encodeMessage(CompleteRequestSchema, { input: { model } }) as Uint8Array;
    const complete = async (model: string) =>
      decoder.decode(
        decodeMessage(
          CompleteResponseSchema,
          await channel.unary(
            { path: `/${InferenceService.typeName}/Complete`, metadata: {} },
            request(model),
          ),
        ).body,
      );
    const arrived = async (n: number) => {
      while (a.state.calls + b.state.calls < n) await sleep(5);
    };
    const held = [complete("hold")];
    await arrived(1);
    const busy = a.state.calls === 1 ? a : b;
    const other = busy === a ? b : a;
    // Another held call: to the idle replica. A third: both have one, so to the preferred one.
    held.push(complete("hold"));
    await arrived(2);
    expect([busy.state.calls, other.state.calls]).toEqual([1, 1]);
    held.push(complete("hold"));
    await arrived(3);
    const twice = a.state.calls === 2 ? a : b;
    const once = twice === a ? b : a;
    const before = lookups;
    // Looked up again, to the same replicas: a call goes to the one with fewer in flight. Counts
    // that restarted at zero would send it to the preferred one, the busier.
    expect(await complete("ok")).toBe(once.name);
    expect(lookups).toBeGreaterThan(before);
    a.state.release();
    b.state.release();
    expect((await Promise.all(held)).sort()).toEqual([twice.name, twice.name, once.name].sort());
    channel.close();
  });

  it("keeps a process alive while a call is in flight, and not once its channel is idle", async () => {
    const a = await replica("a", { delayMs: 300 });
    // The child makes one call and never closes its client: it must still exit by itself.
    const child = childScript(`
      import { createClient } from "@tollgate/kit/grpc";
      import { InferenceService } from "@tollgate/proto/inference";
      const client = createClient(InferenceService, "127.0.0.1:${a.port}");
      const res = await client.complete({});
      console.log(new TextDecoder().decode(res.body));
    `);
    const timer = setTimeout(() => child.kill(), 10_000);
    const { out, code } = await outputOf(child);
    clearTimeout(timer);
    // Answered after 300 ms (the call kept the process alive), then exited on its own (0), not killed.
    expect(out.trim()).toBe("a");
    expect(code).toBe(0);
  });

  it("fails a call whose metadata HTTP/2 cannot carry (a key with a space) at once, and keeps serving", async () => {
    const a = await replica("a");
    const channel = new Channel(`127.0.0.1:${a.port}`);
    await channel.ready(5_000);
    const path = `/${InferenceService.typeName}/Complete`;
    const body = encodeMessage(CompleteRequestSchema, {}) as Uint8Array;
    const err = await channel.unary({ path, metadata: { "x bad": "b" } }, body).catch((e: unknown) => e);
    expect((err as RemoteError).status).toBe(GrpcStatus.INTERNAL);
    // The connection was not taken for a broken one.
    const ok = decodeMessage(CompleteResponseSchema, await channel.unary({ path, metadata: {} }, body));
    expect(decoder.decode(ok.body)).toBe("a");
    channel.close();
  });

  it("makes a call the server refused unread (REFUSED_STREAM) once more, and fails it the second time", async () => {
    // A bare HTTP/2 server speaking gRPC: it refuses the first `refuse` streams unread, then
    // answers each with one message and an OK status.
    let refuse = 1;
    let streams = 0;
    const server = http2.createServer().on("stream", (stream) => {
      streams++;
      stream.on("error", () => {});
      if (refuse-- > 0) return stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      stream.on("data", () => {});
      stream.on("end", () => {
        stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
        stream.end(Buffer.from([0, 0, 0, 0, 2, 0x6f, 0x6b]));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const channel = new Channel(`127.0.0.1:${(server.address() as AddressInfo).port}`);
    try {
      const head = { path: "/t.T/M", metadata: {} };
      expect((await channel.unary(head, new Uint8Array())).toString()).toBe("ok");
      expect(streams).toBe(2);
      // Refused twice in a row: the call fails UNAVAILABLE rather than trying for ever.
      refuse = 2;
      const err = await channel.unary(head, new Uint8Array()).catch((e: unknown) => e);
      expect((err as RemoteError).status).toBe(GrpcStatus.UNAVAILABLE);
      expect(streams).toBe(4);
    } finally {
      channel.close();
      server.close();
    }
  });

  it("carries many large calls at once on one connection (no session memory limit to trip)", async () => {
    const a = await replica("a", { delayMs: 100 });
    const client = createClient(InferenceService, `127.0.0.1:${a.port}`);
    await client.$ready(5_000);
    // 24 calls of 1 MiB each in flight: more than Node's default 10 MB per HTTP/2 session.
    const body = new Uint8Array(1024 * 1024).fill(97);
    const answers = await Promise.all(
      Array.from({ length: 24 }, () =>
        client.complete({ input: { body } }).then(
          (r) => decoder.decode(r.body),
          (e: unknown) => String(e),
        ),
      ),
    );
    client.$close();
    expect(answers).toEqual(Array(24).fill("a"));
  });
});
