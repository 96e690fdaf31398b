import { AuthService, Route } from "@tollgate/proto/auth";
import { InferenceService } from "@tollgate/proto/inference";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AccessTable } from "./credentials.js";
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
import { inProcessClient } from "./in-process.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

const unimplemented = async (): Promise<never> => {
  throw new StatusError(GrpcStatus.UNIMPLEMENTED, "unimplemented", "not implemented in this test");
};

/** Every method of AuthService, mapped to `value`: the test overrides the few it uses. */
const everyAuthMethod = <T>(value: T) =>
  Object.fromEntries(Object.keys(AuthService.method).map((name) => [name, value]));

const auth: Handlers<typeof AuthService> = {
  ...(everyAuthMethod(unimplemented) as unknown as Handlers<typeof AuthService>),
  async authorize(req, ctx) {
    if (req.key === "deny") {
      throw new StatusError(GrpcStatus.RESOURCE_EXHAUSTED, "rate_limited", "too many requests", {
        "retry-after": "7",
      });
    }
    if (req.key === "boom") throw new Error("database password is hunter2");
    if (req.key === "slow") {
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
      throw new Error("aborted");
    }
    return {
      principal: { accountId: "acct_1", connectionId: "conn_1", keyId: `key:${req.key}` },
      model: req.model === "" ? "tollgate-mini" : req.model,
      ...(req.maxOutputTokens !== undefined ? { maxOutputTokens: req.maxOutputTokens } : {}),
      reservationId: req.requestId,
    };
  },
};

/** What the stream handler saw: its cleanup ran, its signal aborted. */
const seen = { cleanedUp: 0, aborted: 0 };

const inference: Handlers<typeof InferenceService> = {
  async complete() {
    return { body: encoder.encode("x") };
  },
  async *streamComplete(req, ctx) {
    try {
      for (let i = 0; i < 1_000; i++) {
        if (req.input?.model === "fail-midway" && i === 2) {
          throw new StatusError(GrpcStatus.UNAVAILABLE, "upstream_unavailable", "the upstream went away");
        }
        yield { event: { case: "chunk", value: encoder.encode(`chunk-${i}`) } };
        if (req.input?.model === "short" && i === 2) break;
      }
      yield { event: { case: "usage", value: { inputTokens: 3, outputTokens: 5, cost: "7" } } };
    } finally {
      seen.cleanedUp++;
      if (ctx.signal.aborted) seen.aborted++;
    }
  },
};

const authAccess: AccessTable<MethodsOf<typeof AuthService>> = {
  ...(everyAuthMethod([]) as unknown as AccessTable<MethodsOf<typeof AuthService>>),
  authorize: ["api-edge"],
  settleReservation: ["metering"],
  settleReservations: ["metering"],
};
const inferenceAccess: AccessTable<MethodsOf<typeof InferenceService>> = {
  complete: ["api-edge"],
  streamComplete: ["api-edge"],
};

/** A failure's fields as a caller can see them. */
async function failure(p: Promise<unknown>) {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RemoteError);
  const r = err as RemoteError;
  return { status: r.status, code: r.code, message: r.message, details: r.details };
}

describe("inProcessClient", () => {
  const log = pino({ level: "silent" });
  let server: Server;
  let remote: Client<MethodsOf<typeof AuthService>>;
  const local = inProcessClient(
    { service: AuthService, handlers: auth, access: authAccess, log },
    "api-edge",
  );
  const stream = inProcessClient(
    { service: InferenceService, handlers: inference, access: inferenceAccess, log },
    "api-edge",
  );

  beforeAll(async () => {
    server = createServer();
    addService(server, AuthService, auth, log);
    const port = await bindServer(server, "127.0.0.1", 0);
    remote = createClient(AuthService, `127.0.0.1:${port}`);
    await remote.$ready(5_000);
  });

  afterAll(async () => {
    remote?.$close();
    if (server) await shutdownServer(server, 1_000);
  });

  it("answers the same message a remote call does", async () => {
    const req = { key: "tg_abc", route: Route.CHAT_COMPLETIONS, model: "", requestId: "req_1" };
    const [a, b] = await Promise.all([local.authorize(req), remote.authorize(req)]);
    expect(a).toEqual(b);
    expect(a.principal?.keyId).toBe("key:tg_abc");
    expect(a.maxOutputTokens).toBeUndefined();
  });

  it("rejects with the RemoteError a remote call rejects with: domain code, details, no leak", async () => {
    for (const key of ["deny", "boom"]) {
      const req = { key, model: "" };
      expect(await failure(local.authorize(req))).toEqual(await failure(remote.authorize(req)));
    }
    const boom = await failure(local.authorize({ key: "boom", model: "" }));
    expect(boom).toMatchObject({ status: GrpcStatus.INTERNAL, code: "internal", message: "internal error" });
    expect(JSON.stringify(boom)).not.toContain("hunter2");
    const deny = await failure(local.authorize({ key: "deny", model: "" }));
    expect(deny).toMatchObject({ code: "rate_limited", details: { "retry-after": "7" } });
  });

  it("refuses a caller the access table does not list, before the handler runs", async () => {
    const asRouter = inProcessClient(
      { service: AuthService, handlers: auth, access: authAccess, log },
      "inference-router",
    );
    expect(await failure(asRouter.authorize({ key: "tg_abc", model: "" }))).toMatchObject({
      status: GrpcStatus.PERMISSION_DENIED,
      code: "permission_denied",
    });
  });

  it("cancels on the caller's signal and on the deadline, and the handler sees it", async () => {
    const ac = new AbortController();
    const cancelled = failure(local.authorize({ key: "slow", model: "" }, { signal: ac.signal }));
    ac.abort();
    expect(await cancelled).toMatchObject({ status: GrpcStatus.CANCELLED });
    expect(await failure(local.authorize({ key: "slow", model: "" }, { timeoutMs: 20 }))).toMatchObject({
      status: GrpcStatus.DEADLINE_EXCEEDED,
    });
  });

  it("streams every message, and a failure midway after the chunks sent", async () => {
    const got: string[] = [];
    for await (const m of stream.streamComplete({ input: { requestId: "r", model: "short" } })) {
      got.push(m.event.case === "chunk" ? decoder.decode(m.event.value) : `usage:${m.event.value?.cost}`);
    }
    expect(got).toEqual(["chunk-0", "chunk-1", "chunk-2", "usage:7"]);
    const chunks: string[] = [];
    const err = await (async () => {
      for await (const m of stream.streamComplete({ input: { requestId: "r", model: "fail-midway" } })) {
        if (m.event.case === "chunk") chunks.push(decoder.decode(m.event.value));
      }
    })().catch((e: unknown) => e);
    expect(chunks).toEqual(["chunk-0", "chunk-1"]);
    expect(err).toBeInstanceOf(RemoteError);
    expect((err as RemoteError).code).toBe("upstream_unavailable");
  });

  it("runs the handler's cleanup, with its signal aborted, when the caller stops reading", async () => {
    const before = { ...seen };
    let n = 0;
    for await (const _ of stream.streamComplete({ input: { requestId: "r", model: "long" } })) {
      if (++n === 3) break;
    }
    await new Promise((r) => setTimeout(r, 10));
    expect(seen.cleanedUp).toBe(before.cleanedUp + 1);
    expect(seen.aborted).toBe(before.aborted + 1);
  });
});
