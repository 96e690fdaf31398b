import { AuthService, Route } from "@tollgate/proto/auth";
import { InferenceService, Operation } from "@tollgate/proto/inference";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseTarget } from "./channel.js";
import {
  addService,
  bindServer,
  type Client,
  createClient,
  createServer,
  GrpcStatus,
  type Handlers,
  type MethodsOf,
  RemoteError,
  StatusError,
  shutdownServer,
} from "./grpc.js";
import type { GrpcHttp2Server as Server } from "./grpc-server.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Resolves with `value` or rejects after `ms`, so a missing event fails the test quickly. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    promise,
    new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms)),
  ]);
}

/** Resolves when `signal` aborts. */
function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

/** Resolves, per request id, when the flood handler's cleanup ran. */
const serverCleanedUp = new Map<string, Promise<void>>();

/** Records, per request id, that the server saw the caller go away. */
const serverSawAbort = new Map<string, Promise<void>>();

// The admin RPCs of AuthService are not exercised here.
const unimplemented = async (): Promise<never> => {
  throw new StatusError(GrpcStatus.UNIMPLEMENTED, "unimplemented", "not implemented in this test");
};

const auth: Handlers<typeof AuthService> = {
  acquireLease: unimplemented,
  returnLease: unimplemented,
  createAccount: unimplemented,
  createConnection: unimplemented,
  createKey: unimplemented,
  listKeys: unimplemented,
  revokeKey: unimplemented,
  rotateKey: unimplemented,
  listAccounts: unimplemented,
  getAccount: unimplemented,
  updateAccount: unimplemented,
  deleteAccount: unimplemented,
  getConnection: unimplemented,
  updateConnection: unimplemented,
  deleteConnection: unimplemented,
  getKey: unimplemented,
  updateKey: unimplemented,
  settleReservation: unimplemented,
  settleReservations: unimplemented,
  async authorize(req) {
    if (req.key === "deny") {
      throw new StatusError(
        GrpcStatus.PERMISSION_DENIED,
        "model_not_allowed",
        "the model 'x' is not allowed",
      );
    }
    if (req.key === "boom") throw new Error("database password is hunter2");
    if (req.key === "slow-down") {
      throw new StatusError(GrpcStatus.RESOURCE_EXHAUSTED, "rate_limited", "too many requests", {
        "retry-after": "7",
        "ratelimit-limit": "10",
      });
    }
    return {
      principal: { accountId: "acct_1", connectionId: "conn_1", keyId: `key:${req.key}` },
      model: req.model === "" ? "tollgate-mini" : req.model,
      ...(req.maxOutputTokens !== undefined ? { maxOutputTokens: req.maxOutputTokens } : {}),
      allowedModels: ["tollgate-mini", "tollgate-pro", "tollgate-reasoner"],
      defaultModel: "tollgate-mini",
      reservationId: req.requestId,
    };
  },
};

const inference: Handlers<typeof InferenceService> = {
  async complete(req) {
    const body = decoder.decode(req.input?.body);
    return {
      body: encoder.encode(`echo:${body}`),
      usage: { inputTokens: 12, outputTokens: 34, cost: "123456789012345678901", pricingSnapshotId: "ps_1" },
    };
  },
  async *streamComplete(req, ctx) {
    const id = req.input?.requestId ?? "";
    const mode = req.input?.model ?? "";
    if (mode === "flood") {
      // Yields far more than the socket buffers hold; its cleanup must still run on cancel.
      let finish: () => void = () => {};
      serverCleanedUp.set(
        id,
        new Promise<void>((r) => {
          finish = r;
        }),
      );
      try {
        for (let i = 0; i < 100_000; i++)
          yield { event: { case: "chunk", value: new Uint8Array(64 * 1024) } };
      } finally {
        finish();
      }
      return;
    }
    if (mode === "hang") {
      serverSawAbort.set(id, aborted(ctx.signal));
      yield { event: { case: "chunk", value: encoder.encode("first") } };
      await aborted(ctx.signal);
      return;
    }
    for (let i = 0; i < 5; i++) yield { event: { case: "chunk", value: encoder.encode(`chunk-${i}`) } };
    if (mode === "fail-midway") {
      throw new StatusError(GrpcStatus.UNAVAILABLE, "upstream_unavailable", "the upstream went away");
    }
    yield { event: { case: "usage", value: { inputTokens: 3, outputTokens: 5, cost: "7" } } };
  },
};

describe("grpc bridge", () => {
  let server: Server;
  let authClient: Client<MethodsOf<typeof AuthService>>;
  let inferenceClient: Client<MethodsOf<typeof InferenceService>>;

  beforeAll(async () => {
    const log = pino({ level: "silent" });
    server = createServer();
    addService(server, AuthService, auth, log);
    addService(server, InferenceService, inference, log);
    const port = await bindServer(server, "127.0.0.1", 0);
    expect(port).toBeGreaterThan(0);
    authClient = createClient(AuthService, `127.0.0.1:${port}`);
    inferenceClient = createClient(InferenceService, `127.0.0.1:${port}`);
    await authClient.$ready(5_000);
  });

  afterAll(async () => {
    authClient?.$close();
    inferenceClient?.$close();
    if (server) await shutdownServer(server, 1_000);
  });

  it("carries a unary request and response field for field", async () => {
    const res = await authClient.authorize({
      key: "tg_abc",
      route: Route.CHAT_COMPLETIONS,
      model: "tollgate-pro",
      maxOutputTokens: 777,
      requestId: "req_1",
    });
    expect(res.principal).toMatchObject({ accountId: "acct_1", connectionId: "conn_1", keyId: "key:tg_abc" });
    expect(res.model).toBe("tollgate-pro");
    expect(res.maxOutputTokens).toBe(777);
    expect(res.allowedModels).toEqual(["tollgate-mini", "tollgate-pro", "tollgate-reasoner"]);
    expect(res.defaultModel).toBe("tollgate-mini");
    expect(res.reservationId).toBe("req_1");
  });

  it("makes no AbortController for a call whose handler never reads its signal", async () => {
    const Real = globalThis.AbortController;
    let made = 0;
    globalThis.AbortController = class extends Real {
      constructor() {
        super();
        made++;
      }
    };
    try {
      for (let i = 0; i < 5; i++) await authClient.authorize({ key: "tg_abc", model: "" });
    } finally {
      globalThis.AbortController = Real;
    }
    expect(made).toBe(0);
  });

  it("keeps an absent optional field absent", async () => {
    const res = await authClient.authorize({ key: "tg_abc", route: Route.MODELS, model: "" });
    expect(res.maxOutputTokens).toBeUndefined();
    expect(res.model).toBe("tollgate-mini");
  });

  it("carries bytes and nested messages", async () => {
    const res = await inferenceClient.complete({
      input: { requestId: "req_2", operation: Operation.CHAT, model: "m", body: encoder.encode('{"a":1}') },
    });
    expect(decoder.decode(res.body)).toBe('echo:{"a":1}');
    expect(res.usage).toMatchObject({
      inputTokens: 12,
      outputTokens: 34,
      cost: "123456789012345678901",
      pricingSnapshotId: "ps_1",
    });
  });

  it("delivers a domain error with its status, code and message", async () => {
    const err = await authClient.authorize({ key: "deny" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RemoteError);
    expect(err).toMatchObject({
      status: GrpcStatus.PERMISSION_DENIED,
      code: "model_not_allowed",
      message: "the model 'x' is not allowed",
    });
  });

  it("carries error details as tollgate-* trailing metadata", async () => {
    const err = await authClient.authorize({ key: "slow-down" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RemoteError);
    expect(err).toMatchObject({ status: GrpcStatus.RESOURCE_EXHAUSTED, code: "rate_limited" });
    expect((err as RemoteError).details).toEqual({ "retry-after": "7", "ratelimit-limit": "10" });
    const plain = await authClient.authorize({ key: "deny" }).catch((e: unknown) => e);
    expect((plain as RemoteError).details).toEqual({});
  });

  it("refuses a detail name that cannot travel as metadata", () => {
    for (const name of ["Upper", "code", "x-bin", "a b", ""]) {
      expect(() => new StatusError(GrpcStatus.INTERNAL, "x", "y", { [name]: "v" })).toThrow(TypeError);
    }
  });

  it("turns an unexpected failure into INTERNAL without leaking its message", async () => {
    const err = await authClient.authorize({ key: "boom" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RemoteError);
    expect(err).toMatchObject({ status: GrpcStatus.INTERNAL, code: "internal", message: "internal error" });
    expect(String((err as Error).message)).not.toContain("hunter2");
  });

  it("streams every message in order", async () => {
    const got: string[] = [];
    for await (const msg of inferenceClient.streamComplete({ input: { requestId: "req_3", model: "ok" } })) {
      if (msg.event.case === "chunk") got.push(decoder.decode(msg.event.value));
      if (msg.event.case === "usage") got.push(`usage:${msg.event.value.cost}`);
    }
    expect(got).toEqual(["chunk-0", "chunk-1", "chunk-2", "chunk-3", "chunk-4", "usage:7"]);
  });

  it("delivers the messages sent before a stream fails, then the domain error", async () => {
    const got: string[] = [];
    let err: unknown;
    try {
      for await (const msg of inferenceClient.streamComplete({
        input: { requestId: "req_4", model: "fail-midway" },
      })) {
        if (msg.event.case === "chunk") got.push(decoder.decode(msg.event.value));
      }
    } catch (e) {
      err = e;
    }
    expect(got).toEqual(["chunk-0", "chunk-1", "chunk-2", "chunk-3", "chunk-4"]);
    expect(err).toBeInstanceOf(RemoteError);
    expect(err).toMatchObject({
      status: GrpcStatus.UNAVAILABLE,
      code: "upstream_unavailable",
      message: "the upstream went away",
    });
  });

  it("aborts the server handler's signal when the caller aborts mid-stream", async () => {
    const controller = new AbortController();
    const stream = inferenceClient.streamComplete(
      { input: { requestId: "req_5", model: "hang" } },
      { signal: controller.signal },
    );
    const iter = stream[Symbol.asyncIterator]();
    const first = await within(iter.next(), 5_000, "the first message");
    expect(first.done).toBe(false);
    const sawAbort = serverSawAbort.get("req_5");
    expect(sawAbort).toBeDefined();
    controller.abort();
    // The caller's iteration ends (with a cancellation error or done), never hangs.
    await within(
      iter.next().catch(() => undefined),
      5_000,
      "the client stream to end",
    );
    await within(sawAbort!, 5_000, "the server to see the abort");
  });

  it("runs the handler's cleanup when a slow caller cancels while the stream is full", async () => {
    const controller = new AbortController();
    const iter = inferenceClient
      .streamComplete({ input: { requestId: "req_flood", model: "flood" } }, { signal: controller.signal })
      [Symbol.asyncIterator]();
    await within(iter.next(), 5_000, "the first message");
    // Stop reading until the server's write buffer is full and it waits for "drain".
    await new Promise((r) => setTimeout(r, 500));
    controller.abort();
    await iter.return?.(undefined);
    await within(serverCleanedUp.get("req_flood")!, 5_000, "the server handler's cleanup");
  });

  it("fails a call that outlives its timeout with DEADLINE_EXCEEDED", async () => {
    const iter = inferenceClient
      .streamComplete({ input: { requestId: "req_6", model: "hang" } }, { timeoutMs: 300 })
      [Symbol.asyncIterator]();
    await within(iter.next(), 5_000, "the first message");
    const err = await within(
      iter.next().then(
        () => undefined,
        (e: unknown) => e,
      ),
      5_000,
      "the deadline",
    );
    expect(err).toBeInstanceOf(RemoteError);
    expect((err as RemoteError).status).toBe(GrpcStatus.DEADLINE_EXCEEDED);
  });
});

describe("parseTarget", () => {
  it("reads a comma list as that many replicas", () => {
    expect(parseTarget("a:1,b:2")).toEqual({ kind: "static", addresses: ["a:1", "b:2"] });
    expect(parseTarget(" 10.0.0.1:50052 , 10.0.0.2:50052 ")).toEqual({
      kind: "static",
      addresses: ["10.0.0.1:50052", "10.0.0.2:50052"],
    });
  });

  it("looks a single name up (with or without dns:///); an IP is itself", () => {
    expect(parseTarget("router:50052")).toEqual({ kind: "dns", host: "router", port: "50052" });
    expect(parseTarget("dns:///router.tollgate.svc:50052")).toEqual({
      kind: "dns",
      host: "router.tollgate.svc",
      port: "50052",
    });
    expect(parseTarget("127.0.0.1:7")).toEqual({ kind: "static", addresses: ["127.0.0.1:7"] });
    expect(parseTarget("[::1]:7")).toEqual({ kind: "static", addresses: ["[::1]:7"] });
  });
});
