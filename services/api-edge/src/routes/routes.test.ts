import { connect } from "node:net";
import { gzipSync } from "node:zlib";
import { create } from "@bufbuild/protobuf";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { createMetrics } from "@tollgate/kit/metrics";
import {
  AcquireLeaseResponseSchema,
  AuthorizeResponseSchema,
  ModelPriceSchema,
  Route,
} from "@tollgate/proto/auth";
import { ERRORS } from "@tollgate/proto/errors";
import {
  CompleteResponseSchema,
  type CompletionInput,
  INFERENCE_DETAILS,
  Operation,
  StreamCompleteResponseSchema,
} from "@tollgate/proto/inference";
import { Action } from "@tollgate/proto/payment";
import { ROUTE_IDS, ROUTES, type RouteId, type RouteSpec } from "@tollgate/proto/routes";
import type { FastifyInstance, InjectOptions } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { createMemoryIdempotencyStore } from "../adapters/memory-idempotency-store.js";
import { type ApiEdgePorts, buildApp } from "../app.js";
import { MAX_WAITING_DUPLICATES } from "../http/idempotency.js";
import {
  AUTH_TIMEOUT_MS,
  type AuthClient,
  type InferenceClient,
  type MeteringClient,
  type PaymentClient,
} from "./context.js";
import type { LeaseClient } from "./leases.js";

// The public port built in process from in-memory ports and driven with app.inject(): each
// route's answers, status, error code and notable headers, as a caller sees them.

const GOOD_KEY = "tg_good_0123456789abcdefghijABCDEFGHIJ";
const BAD_KEY = "tg_bad_0123456789abcdefghijABCDEFGHIJ";
/** A good key of another account than GOOD_KEY's. */
const OTHER_KEY = "tg_other_0123456789abcdefghijABCDEFGHIJ";
const ACCOUNTS: Record<string, string> = { [GOOD_KEY]: "acct_good", [OTHER_KEY]: "acct_other" };
const VISIBLE = ["small", "large"];

const CHAT_ANSWER = {
  id: "chatcmpl-1",
  object: "chat.completion",
  created: 1,
  model: "small",
  choices: [{ index: 0, message: { role: "assistant", content: "hi" }, finish_reason: "stop" }],
  usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
};
const TEXT_ANSWER = {
  id: "cmpl-1",
  object: "text_completion",
  created: 1,
  model: "small",
  choices: [{ index: 0, text: "hi", finish_reason: "stop" }],
  usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
};

// The router's embeddings answer, shaped as the caller gets it.
const EMBED_ANSWER = {
  object: "list",
  data: [
    { object: "embedding", index: 0, embedding: [0.6, 0.8] },
    { object: "embedding", index: 1, embedding: "AACAPw==" },
  ],
  model: "embed",
  usage: { prompt_tokens: 3, total_tokens: 3 },
};

interface Fakes {
  /** Makes the next inference call fail with this error. */
  inferenceFails?: Error;
  /** Makes every authorization fail with this error. */
  authFails?: Error;
  /** Every authorization answers only once this settles (a slow auth-policy). */
  authWaits?: Promise<void>;
  /** How many calls the router was asked for, cancelled ones included. */
  routerCalls?: number;
  /** Every buffered model call answers only once this settles (a slow model). */
  completeWaits?: Promise<void>;
  authorized: Route[];
  /** The text of each chunk of the next stream; default one chunk "hi". */
  streamTexts?: string[];
  /** The finish reason of the stream's last chunk; default "stop". */
  streamFinish?: string;
  /** Makes the next stream fail with this error after its chunks. */
  streamCut?: Error;
  /** The stream stops after its chunks without its usage and without an error (a killed router). */
  streamStops?: boolean;
  /** The usage events recorded with metering (a stream whose router was lost mid-way). */
  recorded: { eventId: string; cost: string }[];
  /** metering fails every RecordUsage with this. */
  meteringFails?: Error;
  /** Each lease returned: what it says was committed on it. */
  returned: string[];
  /** The unsure tickets of each lease returned (requests whose end it never learnt). */
  returnedUnsure: { ticket: number; quote: string }[][];
  /** The reservation each stream the router was asked to run is billed to. */
  streamReservations: string[];
  /** Every settlement asked of auth-policy: the hold's actual cost. */
  settled: string[];
  /** The chat bodies the router was asked to run. */
  forwarded: unknown[];
  /** Makes every Verify of a paid credential fail with this error. */
  verifyFails?: Error;
  /** Every Verify answers only once this settles (a slow mpp-payment, an open on chain). */
  verifyWaits?: Promise<void>;
  /** The action every Verify answers (default: a voucher, its hold taken). */
  verifyAction?: Action;
  /** The channels a Close was asked for. */
  closed: string[];
  /** The paid holds given back (Release), by reservation id. */
  released: string[];
  /** What each authorization asked: its output cap and message count. */
  asked: {
    maxOutputTokens?: number | undefined;
    messageCount?: number | undefined;
    checkOnly: boolean;
    bodyBytes?: number | undefined;
    estimatedInputTokens?: number | undefined;
  }[];
  /** The inputs of the buffered calls the router was asked to run. */
  completed: CompletionInput[];
  /**
   * What each authorization says is left of the budgets that apply, once its hold is taken:
   * the connection's and the key's own ("" where none applies). Default: the connection's, 950.
   */
  budgetsLeft?: { connection: string; key: string };
  /**
   * With leases: the budget of the next lease acquired (input 1 unit a token, output free);
   * undefined: none is granted, each request is authorized on its own.
   */
  leaseBudget?: bigint;
  /** With leases: AcquireLease finds no answer, DEADLINE_EXCEEDED after this long (a stalled auth-policy). */
  leaseStallsMs?: number;
  /** The deadline each authorization was sent with (ms). */
  authDeadlines?: number[];
}

function fakePorts(f: Fakes, withPayment: boolean, withLeases = false): ApiEdgePorts {
  const auth: AuthClient = {
    authorize: async (req, o) => {
      f.authDeadlines?.push(o?.timeoutMs ?? Number.POSITIVE_INFINITY);
      await f.authWaits;
      const account = ACCOUNTS[req.key ?? ""];
      if (!account) {
        throw new RemoteError(GrpcStatus.UNAUTHENTICATED, "invalid_api_key", "the key is not valid");
      }
      f.asked.push({
        maxOutputTokens: req.maxOutputTokens,
        messageCount: req.messageCount,
        checkOnly: req.checkOnly === true,
        bodyBytes: req.bodyBytes,
        estimatedInputTokens: req.estimatedInputTokens,
      });
      if (f.authFails) throw f.authFails;
      f.authorized.push(req.route ?? Route.UNSPECIFIED);
      return create(AuthorizeResponseSchema, {
        principal: { accountId: account, keyId: `key_${account}` },
        model: req.model || "small",
        allowedModels: VISIBLE,
        defaultModel: "small",
        ...(req.maxOutputTokens !== undefined ? { maxOutputTokens: req.maxOutputTokens } : {}),
        ...(req.route === Route.MODELS
          ? {
              modelPrices: [
                create(ModelPriceSchema, { model: "small", inputPerMillion: "100", outputPerMillion: "200" }),
              ],
            }
          : {
              quote: "50",
              reservationId: "res_1",
              budgetRemaining: f.budgetsLeft?.connection ?? "950",
              keyBudgetRemaining: f.budgetsLeft?.key ?? "",
            }),
      });
    },
    settleReservation: async (req) => {
      f.settled.push(req.actualCost ?? "");
      return { $typeName: "tollgate.auth.v1.SettleReservationResponse" } as never;
    },
  };
  const inference: InferenceClient = {
    complete: async (req, opts) => {
      f.routerCalls = (f.routerCalls ?? 0) + 1;
      // As the transport does: a call whose caller already left is cancelled at once.
      if (opts?.signal?.aborted) throw new RemoteError(GrpcStatus.CANCELLED, undefined, "cancelled");
      await f.completeWaits;
      if (req.input) f.completed.push(req.input as CompletionInput);
      if (f.inferenceFails) throw f.inferenceFails;
      const op = req.input?.operation;
      const text =
        op === Operation.TEXT ? TEXT_ANSWER : op === Operation.EMBEDDINGS ? EMBED_ANSWER : CHAT_ANSWER;
      return create(CompleteResponseSchema, {
        body: Buffer.from(JSON.stringify(text)),
        usage: { inputTokens: 3, outputTokens: 1, cost: "7", eventId: "ev_1" },
      });
    },
    streamComplete: (req, opts) =>
      (async function* () {
        f.routerCalls = (f.routerCalls ?? 0) + 1;
        if (opts?.signal?.aborted) throw new RemoteError(GrpcStatus.CANCELLED, undefined, "cancelled");
        f.forwarded.push(JSON.parse(Buffer.from(req.input?.body ?? []).toString("utf8")));
        f.streamReservations.push(req.input?.billing?.reservationId ?? "");
        if (f.inferenceFails) throw f.inferenceFails;
        const texts = f.streamTexts ?? ["hi"];
        for (const [i, text] of texts.entries()) {
          const last = i === texts.length - 1 && !f.streamCut && !f.streamStops;
          const chunk = {
            id: "c-1",
            object: "chat.completion.chunk",
            choices: [
              { index: 0, delta: { content: text }, finish_reason: last ? (f.streamFinish ?? "stop") : null },
            ],
          };
          yield create(StreamCompleteResponseSchema, {
            event: { case: "chunk", value: Buffer.from(JSON.stringify(chunk)) },
            usageSoFar: { eventId: "ev_1", cost: String(i + 1) },
          });
        }
        if (f.streamCut) throw f.streamCut;
        if (f.streamStops) return;
        yield create(StreamCompleteResponseSchema, {
          event: {
            case: "usage",
            value: { inputTokens: 3, outputTokens: texts.length, cost: "7", eventId: "ev_1" },
          },
        });
      })(),
  };
  const payment = {
    challenge: async () => ({
      $typeName: "tollgate.payment.v1.ChallengeResponse",
      wwwAuthenticate: 'Payment id="ch_1", method="tempo", intent="session"',
      challengeId: "ch_1",
    }),
    // A voucher accepted with its hold taken in the same call.
    verify: async () => {
      await f.verifyWaits;
      if (f.verifyFails) throw f.verifyFails;
      return {
        $typeName: "tollgate.payment.v1.VerifyResponse",
        action: f.verifyAction ?? Action.VOUCHER,
        channelId: "0xchannel",
        challengeId: "ch_1",
        acceptedCumulative: "1000",
        paymentReceipt: "",
        quote: "100",
        reservationId: "hold_1",
        acceptedReceipt: "accepted-receipt",
        reservedReceipt: "",
      };
    },
    close: async () => {
      f.closed.push("0xchannel");
      return { $typeName: "tollgate.payment.v1.CloseResponse", paymentReceipt: "close-receipt" };
    },
    release: async (req: { reservationId: string }) => {
      f.released.push(req.reservationId);
      return { $typeName: "tollgate.payment.v1.ReleaseResponse" };
    },
  } as unknown as PaymentClient;
  const leases: LeaseClient = {
    acquireLease: async (req, o) => {
      if (f.leaseStallsMs !== undefined) {
        await new Promise((r) => setTimeout(r, Math.min(f.leaseStallsMs!, o?.timeoutMs ?? Infinity)));
        throw new RemoteError(GrpcStatus.DEADLINE_EXCEEDED, undefined, "no answer before the deadline");
      }
      return create(AcquireLeaseResponseSchema, {
        granted: f.leaseBudget !== undefined,
        useMs: f.leaseBudget !== undefined ? 60_000 : 0,
        leaseId: "lease_1",
        budget: f.leaseBudget?.toString() ?? "",
        prices: { model: "small", inputPerMillion: "1000000", outputPerMillion: "0" },
        grant: {
          principal: { accountId: ACCOUNTS[req.request?.key ?? ""] ?? "", keyId: "key_1" },
          model: "small",
          allowedModels: VISIBLE,
          defaultModel: "small",
          budgetRemaining: "1000",
        },
      });
    },
    returnLease: async (req) => {
      f.returned.push(req.committed ?? "");
      f.returnedUnsure.push((req.unsure ?? []).map((u) => ({ ticket: u.ticket ?? 0, quote: u.quote ?? "" })));
      return { $typeName: "tollgate.auth.v1.ReturnLeaseResponse" } as never;
    },
  };
  const metering: MeteringClient = {
    recordUsage: async (req) => {
      if (f.meteringFails) throw f.meteringFails;
      f.recorded.push({ eventId: req.usage?.eventId ?? "", cost: req.usage?.cost ?? "" });
      return { $typeName: "tollgate.metering.v1.RecordUsageResponse" } as never;
    },
  };
  return {
    auth,
    inference,
    metering,
    ...(withLeases ? { leases } : {}),
    ...(withPayment ? { payment } : {}),
    idempotencyStore: createMemoryIdempotencyStore(),
    log: createLogger({ service: "api-edge", level: "silent" }),
    metrics: createMetrics("api-edge"),
  };
}

const apps: FastifyInstance[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
});

function edge(opts: { withPayment?: boolean; bodyLimitBytes?: number; withLeases?: boolean } = {}) {
  const f: Fakes = {
    authorized: [],
    settled: [],
    forwarded: [],
    asked: [],
    completed: [],
    recorded: [],
    returned: [],
    returnedUnsure: [],
    streamReservations: [],
    released: [],
    closed: [],
  };
  const { app, leases } = buildApp(
    fakePorts(f, opts.withPayment ?? true, opts.withLeases),
    opts.bodyLimitBytes ? { bodyLimitBytes: opts.bodyLimitBytes } : {},
  );
  apps.push(app);
  return { app, f, leases };
}

const bearer = (key = GOOD_KEY) => ({ authorization: `Bearer ${key}` });
const json = { "content-type": "application/json" };

/** A valid body for each route that takes one. */
const BODIES: Partial<Record<RouteId, unknown>> = {
  chat: { model: "small", messages: [{ role: "user", content: "hello" }] },
  completions: { model: "small", prompt: "hello" },
  responses: { model: "small", input: "hello" },
  messages: { model: "small", max_tokens: 16, messages: [{ role: "user", content: "hello" }] },
  think: { model: "small", prompt: "hello" },
  embeddings: { model: "embed", input: "hello" },
  mppChat: {
    model: "small",
    plan: "Starter",
    model_optimization: false,
    max_tokens: 16,
    messages: [{ role: "user", content: "hello" }],
  },
};

/** A request to `id` as the table gives it, with a valid body and the good key. */
function request(id: RouteId, over: Partial<InjectOptions> = {}): InjectOptions {
  const spec: RouteSpec = ROUTES[id];
  const url = spec.path.replace(":model", "small");
  const body = BODIES[id];
  return {
    method: spec.method,
    url,
    headers: { ...(spec.door === "account" ? bearer() : {}), ...(body ? json : {}) },
    ...(body ? { payload: JSON.stringify(body) } : {}),
    ...over,
  };
}

/** The last event of a finished stream, by route: its `event:` name, or its data when unnamed. */
const STREAM_END: Partial<Record<RouteId, string>> = {
  chat: "[DONE]",
  completions: "[DONE]",
  responses: "response.completed",
  messages: "message_stop",
};

/** The events of an SSE body: each one's `event:` name, its raw data and that data parsed when JSON. */
function sseEvents(body: string): { event?: string; raw: string; data: Record<string, unknown> }[] {
  return body
    .split("\n\n")
    .filter((block) => block.trim() !== "")
    .map((block) => {
      const lines = block.split("\n");
      const event = lines.find((l) => l.startsWith("event: "))?.slice(7);
      const raw = lines.find((l) => l.startsWith("data: "))?.slice(6) ?? "";
      const data = raw.startsWith("{") ? (JSON.parse(raw) as Record<string, unknown>) : {};
      return { ...(event !== undefined ? { event } : {}), raw, data };
    });
}

const ACCOUNT = ROUTE_IDS.filter((id) => ROUTES[id].door === "account");
const WITH_BODY = ACCOUNT.filter((id) => ROUTES[id].schema !== null);
/** A promise the test opens by hand: a fake's answer held back until `open()`. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => {
    open = r;
  });
  return { wait, open };
}

const code = (res: { json(): unknown }) => (res.json() as { error?: { code?: string } }).error?.code;

/** A body the schema refuses: 400 invalid_request whose message matches, nothing run, held or settled. */
function expectRefusedBody(
  res: { statusCode: number; body: string; json(): unknown },
  f: Fakes,
  message: RegExp,
) {
  expect(res.statusCode, res.body).toBe(400);
  expect(code(res)).toBe("invalid_request");
  expect(JSON.stringify(res.json())).toMatch(message);
  expect(f.completed).toEqual([]);
  expect(f.forwarded).toEqual([]);
  expect(f.settled).toEqual([]);
}

describe("each account route, in process", () => {
  it("has a valid body here for every route of the table that takes one", () => {
    expect(WITH_BODY.filter((id) => BODIES[id] === undefined)).toEqual([]);
  });

  it.each(ACCOUNT)("%s answers 200 with the good key", async (id) => {
    const { app } = edge();
    const res = await app.inject(request(id));
    expect(res.statusCode, res.body).toBe(200);
    expect(res.headers["x-request-id"]).toBeTruthy();
    if (ROUTES[id].schema !== null) expect(res.headers["x-tollgate-cost"]).toBe("7");
  });

  it.each(ACCOUNT)("%s answers 401 missing_api_key without a key", async (id) => {
    const { app } = edge();
    const { authorization: _, ...headers } = request(id).headers as Record<string, string>;
    const res = await app.inject(request(id, { headers }));
    expect(res.statusCode).toBe(401);
    expect(code(res)).toBe("missing_api_key");
  });

  it.each(ACCOUNT)("%s answers 401 invalid_api_key with a key auth-policy refuses", async (id) => {
    const { app } = edge();
    const req = request(id);
    const res = await app.inject({ ...req, headers: { ...(req.headers as object), ...bearer(BAD_KEY) } });
    expect(res.statusCode).toBe(401);
    expect(code(res)).toBe("invalid_api_key");
  });

  it.each(WITH_BODY)("%s answers 400 invalid_request for a body its schema refuses", async (id) => {
    const { app } = edge();
    const res = await app.inject(request(id, { payload: JSON.stringify({ model: 42 }) }));
    expect(res.statusCode).toBe(400);
    expect(code(res)).toBe("invalid_request");
  });

  it.each(WITH_BODY)("%s answers 400 invalid_json for a body that is not JSON", async (id) => {
    const { app } = edge();
    const res = await app.inject(request(id, { payload: "{not json" }));
    expect(res.statusCode).toBe(400);
    expect(code(res)).toBe("invalid_json");
  });

  it.each(WITH_BODY)("%s answers 415 unsupported_media_type for a body not sent as JSON", async (id) => {
    const { app } = edge();
    const res = await app.inject(
      request(id, { headers: { ...bearer(), "content-type": "text/plain" }, payload: "hello" }),
    );
    expect(res.statusCode).toBe(415);
    expect(code(res)).toBe("unsupported_media_type");
  });

  it.each(WITH_BODY)("%s answers 415 unsupported_media_type for a compressed body", async (id) => {
    const { app } = edge();
    const body = JSON.stringify({
      model: "small",
      max_tokens: 8,
      messages: [{ role: "user", content: "x" }],
    });
    const res = await app.inject(
      request(id, { headers: { ...bearer(), ...json, "content-encoding": "gzip" }, payload: gzipSync(body) }),
    );
    expect(res.statusCode).toBe(415);
    expect(code(res)).toBe("unsupported_media_type");
    expect(res.json().error.message).toMatch(/uncompressed/);
  });

  it("answers 415 for a body in a transfer coding beside chunked, not reading it as JSON", async () => {
    const { app, f } = edge();
    const res = await app.inject(
      request("chat", { headers: { ...bearer(), ...json, "transfer-encoding": "gzip, chunked" } }),
    );
    expect(res.statusCode).toBe(415);
    expect(code(res)).toBe("unsupported_media_type");
    expect(f.forwarded).toEqual([]);
  });

  // The key is checked before the body (docs/contract.md, "Authentication"): a body refused as
  // unreadable still answers a bad or missing key with its 401.
  const UNREADABLE: ReadonlyArray<[string, Record<string, string>, string | Buffer]> = [
    ["not JSON", json, "{not json"],
    ["too deep", json, "[".repeat(100)],
    ["a duplicate key", json, '{"model":"a","model":"b"}'],
    ["not sent as JSON", { "content-type": "text/plain" }, "hello"],
    ["compressed", { ...json, "content-encoding": "gzip" }, gzipSync('{"model":"small"}')],
  ];
  const KEYLESS: ReadonlyArray<[string, Record<string, string>, string]> = [
    ["no key", {}, "missing_api_key"],
    ["a key auth-policy refuses", bearer(BAD_KEY), "invalid_api_key"],
    ["a Payment credential", { authorization: "Payment abc" }, "wrong_auth_scheme"],
  ];
  const bodyFirstCases = WITH_BODY.flatMap((id) =>
    UNREADABLE.flatMap(([what, headers, payload]) =>
      KEYLESS.map(([who, auth, code]) => [id, what, who, code, { ...headers, ...auth }, payload] as const),
    ),
  );
  it.each(bodyFirstCases)(
    "%s with a body %s and %s answers 401 %s",
    async (id, _what, _who, code, headers, payload) => {
      const { app } = edge();
      const res = await app.inject({ ...request(id), headers, payload });
      expect(res.statusCode, res.body).toBe(401);
      expect((res.json() as { error: { code: string } }).error.code).toBe(code);
    },
  );

  it.each(WITH_BODY.filter((id) => id !== "messages"))(
    "%s answers 401 wrong_auth_field for a key in x-api-key or api-key beside a good Bearer key",
    async (id) => {
      const { app } = edge();
      for (const field of ["x-api-key", "api-key"]) {
        const req = request(id);
        const res = await app.inject({ ...req, headers: { ...(req.headers as object), [field]: GOOD_KEY } });
        expect(res.statusCode, field).toBe(401);
        expect(code(res)).toBe("wrong_auth_field");
      }
    },
  );

  it.each(WITH_BODY)("%s answers 413 payload_too_large above the body limit", async (id) => {
    const { app } = edge({ bodyLimitBytes: 1024 });
    const big = { model: "small", prompt: "x".repeat(4096), messages: [{ role: "user", content: "x" }] };
    const res = await app.inject(request(id, { payload: JSON.stringify(big) }));
    expect(res.statusCode).toBe(413);
    expect(code(res)).toBe("payload_too_large");
  });

  const STREAMING = WITH_BODY.filter((id) => ROUTES[id].streams);
  const BUFFERED = WITH_BODY.filter((id) => !ROUTES[id].streams);

  it.each(STREAMING)("%s answers stream: true as SSE ending as its wire format ends", async (id) => {
    const { app } = edge();
    const res = await app.inject(
      request(id, { payload: JSON.stringify({ ...(BODIES[id] as object), stream: true }) }),
    );
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^text\/event-stream/);
    expect(sseEvents(res.body).at(-1)?.event ?? sseEvents(res.body).at(-1)?.raw).toBe(STREAM_END[id]);
  });

  it.each(STREAMING)("%s answers a stream the router refuses before its first event as JSON", async (id) => {
    const { app, f } = edge();
    f.inferenceFails = new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "bad gateway");
    const res = await app.inject(
      request(id, { payload: JSON.stringify({ ...(BODIES[id] as object), stream: true }) }),
    );
    expect(res.statusCode).toBe(502);
    expect(code(res)).toBe("upstream_error");
  });

  it.each(BUFFERED)(
    "%s, which does not stream, answers stream: true with 400 invalid_request",
    async (id) => {
      const { app } = edge();
      const res = await app.inject(
        request(id, { payload: JSON.stringify({ ...(BODIES[id] as object), stream: true }) }),
      );
      expect(res.statusCode).toBe(400);
      expect(code(res)).toBe("invalid_request");
    },
  );

  // What the router's refusals become on each model-running route (the error table).
  const UPSTREAM: [string, RemoteError, number, string][] = [
    [
      "upstream_error",
      new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "bad gateway"),
      502,
      "upstream_error",
    ],
    [
      "upstream_timeout",
      new RemoteError(GrpcStatus.DEADLINE_EXCEEDED, "upstream_timeout", "slow"),
      504,
      "upstream_timeout",
    ],
    [
      "upstream_rejected",
      new RemoteError(GrpcStatus.INVALID_ARGUMENT, "upstream_rejected", "no"),
      400,
      "upstream_rejected",
    ],
    [
      "a code this build lacks",
      new RemoteError(GrpcStatus.UNAVAILABLE, "newer_code", "x"),
      503,
      "service_unavailable",
    ],
  ];
  for (const [what, err, status, expected] of UPSTREAM) {
    it.each(WITH_BODY)(`%s answers ${status} ${expected} when the router fails with ${what}`, async (id) => {
      const { app, f } = edge();
      f.inferenceFails = err;
      const res = await app.inject(request(id));
      expect(res.statusCode).toBe(status);
      expect(code(res)).toBe(expected);
    });
  }

  it("answers 429 rate_limited with Retry-After and RateLimit-* from auth-policy's details", async () => {
    const { app, f } = edge();
    f.authFails = new RemoteError(GrpcStatus.RESOURCE_EXHAUSTED, "rate_limited", "slow down", {
      "retry-after": "3",
      "ratelimit-limit": "10",
      "ratelimit-remaining": "0",
      "ratelimit-reset": "3",
    });
    const res = await app.inject(request("chat"));
    expect(res.statusCode).toBe(429);
    expect(code(res)).toBe("rate_limited");
    expect(res.headers["retry-after"]).toBe("3");
    expect(res.headers["ratelimit-limit"]).toBe("10");
  });
});

describe('x-tollgate-budget-remaining: what is left of the budget that refuses first (docs/contract.md, "Money")', () => {
  // The hold (50) became the cost (7): each budget's left after the hold, plus 43.
  it.each([
    ["the key's own budget alone", { connection: "", key: "700" }, "743"],
    ["the key's, below its connection's", { connection: "950", key: "700" }, "743"],
    ["the connection's, below the key's", { connection: "600", key: "700" }, "643"],
    ["the connection's alone", { connection: "950", key: "" }, "993"],
  ])("tells %s, buffered and streamed", async (_what, budgetsLeft, told) => {
    const { app, f } = edge();
    f.budgetsLeft = budgetsLeft;
    const buffered = await app.inject(request("chat"));
    expect(buffered.statusCode, buffered.body).toBe(200);
    expect(buffered.headers["x-tollgate-cost"]).toBe("7");
    expect(buffered.headers["x-tollgate-budget-remaining"]).toBe(told);
    // A stream tells it in its trailers and on the event with its usage (here Anthropic's).
    const streamed = await app.inject(
      request("messages", { payload: JSON.stringify({ ...(BODIES.messages as object), stream: true }) }),
    );
    expect(streamed.statusCode, streamed.body).toBe(200);
    expect(streamed.trailers["x-tollgate-budget-remaining"]).toBe(told);
    const usage = sseEvents(streamed.body).find((e) => e.data.x_tollgate !== undefined);
    expect(usage?.data.x_tollgate).toEqual({ cost: "7", budget_remaining: told });
  });

  it("tells none when no budget applies", async () => {
    const { app, f } = edge();
    f.budgetsLeft = { connection: "", key: "" };
    const res = await app.inject(request("chat"));
    expect(res.headers["x-tollgate-cost"]).toBe("7");
    expect(res.headers["x-tollgate-budget-remaining"]).toBeUndefined();
  });
});

describe('a stream whose router is lost mid-way: the caller is told what is charged (docs/money.md, "Records")', () => {
  const STREAMING = WITH_BODY.filter((id) => ROUTES[id].streams);
  /** The final event of a stream that failed after it started, by route: its `event:` name. */
  const STREAM_FAILED: Partial<Record<RouteId, string | undefined>> = {
    chat: undefined,
    completions: undefined,
    responses: "response.failed",
    messages: "error",
  };
  const streamOf = (id: RouteId) =>
    request(id, {
      payload: JSON.stringify({
        ...(BODIES[id] as object),
        stream: true,
        ...(id === "chat" || id === "completions" ? { stream_options: { include_usage: true } } : {}),
      }),
    });
  /** What a killed router's call ends with: a transport failure, no code of the router's own. */
  const killed = () => new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "Connection dropped");

  it.each(STREAMING)(
    "%s ends with its error event and the cost api-edge recorded for what was relayed, as trailers and x_tollgate",
    async (id) => {
      const { app, f } = edge();
      f.streamTexts = ["Hel", "lo"];
      f.streamCut = killed();
      const res = await app.inject(streamOf(id));
      expect(res.statusCode).toBe(200);
      const events = sseEvents(res.body);
      const last = events.at(-1)!;
      expect(last.event).toBe(STREAM_FAILED[id]);
      expect(res.body).not.toContain("[DONE]");
      // The router sent cost 2 as the usage so far with the second chunk: that is what api-edge
      // records (under the router's event id), and what the caller is told.
      expect(f.recorded).toEqual([{ eventId: "ev_1", cost: "2" }]);
      expect(last.data.x_tollgate).toEqual({ cost: "2", budget_remaining: "998" });
      expect(res.trailers["x-tollgate-cost"]).toBe("2");
      expect(res.trailers["x-tollgate-budget-remaining"]).toBe("998");
      // Only the error event carries it.
      expect(events.filter((e) => e.data.x_tollgate !== undefined)).toHaveLength(1);
      expect(f.settled).toEqual([]);
    },
  );

  it("tells the cost of a stream whose router stopped without its usage or an error (a killed process)", async () => {
    const { app, f } = edge();
    f.streamTexts = ["a", "b", "c"];
    f.streamStops = true;
    const res = await app.inject(streamOf("chat"));
    const last = sseEvents(res.body).at(-1)!;
    expect(last.data).toMatchObject({
      error: { code: "service_unavailable" },
      x_tollgate: { cost: "3", budget_remaining: "997" },
    });
    expect(res.trailers["x-tollgate-cost"]).toBe("3");
    expect(f.recorded).toEqual([{ eventId: "ev_1", cost: "3" }]);
  });

  it("tells no cost when the lost router's usage could not be recorded: nothing is charged", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo"];
    f.streamCut = killed();
    f.meteringFails = new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "no metering");
    const res = await app.inject(streamOf("chat"));
    const last = sseEvents(res.body).at(-1)!;
    expect(last.data.error).toMatchObject({ code: "service_unavailable" });
    expect(last.data.x_tollgate).toBeUndefined();
    expect(res.trailers["x-tollgate-cost"]).toBeUndefined();
    expect(f.recorded).toEqual([]);
  });

  it("tells the cost when the router failed the stream itself (it published the usage), metering away or not", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo"];
    f.streamCut = new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "connection reset");
    f.meteringFails = new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "no metering");
    const res = await app.inject(streamOf("chat"));
    const last = sseEvents(res.body).at(-1)!;
    expect(last.data).toMatchObject({ error: { code: "upstream_error" }, x_tollgate: { cost: "2" } });
    expect(res.trailers["x-tollgate-cost"]).toBe("2");
  });

  it("tells no cost when the router answered usage_not_recorded and metering could not record it either", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo"];
    f.streamCut = new RemoteError(GrpcStatus.UNAVAILABLE, "usage_not_recorded", "no bus");
    f.meteringFails = new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "no metering");
    const res = await app.inject(streamOf("chat"));
    expect(sseEvents(res.body).at(-1)!.data.x_tollgate).toBeUndefined();
    expect(res.trailers["x-tollgate-cost"]).toBeUndefined();
  });

  it("on a lease, ends the request's ticket at the cost told: the lease says so when it goes back", async () => {
    const { app, f, leases } = edge({ withLeases: true });
    f.leaseBudget = 100_000n;
    f.streamTexts = ["Hel", "lo"];
    f.streamCut = killed();
    const res = await app.inject(streamOf("chat"));
    // Admitted on the lease (no Authorize call), its reservation a ticket of it.
    expect(f.authorized).toEqual([]);
    expect(res.trailers["x-tollgate-cost"]).toBe("2");
    expect(sseEvents(res.body).at(-1)!.data.x_tollgate).toMatchObject({ cost: "2" });
    await leases!.close();
    expect(f.returned).toEqual(["2"]);
  });
});

describe("an authorization auth-policy does not answer", () => {
  it("waits AUTH_TIMEOUT_MS in all: the request's own Authorize gets what the lease's call left of it", async () => {
    const { app, f, leases } = edge({ withLeases: true });
    f.leaseStallsMs = 300;
    f.authDeadlines = [];
    const res = await app.inject(request("chat"));
    expect(res.statusCode).toBe(200);
    // The lease's call took 300 ms of the one deadline; Authorize was sent with the rest.
    expect(f.authDeadlines).toHaveLength(1);
    expect(f.authDeadlines[0]).toBeLessThanOrEqual(AUTH_TIMEOUT_MS - 290);
    expect(f.authDeadlines[0]).toBeGreaterThan(AUTH_TIMEOUT_MS - 2_000);
    await leases!.close();
  });
});

/**
 * Sends `body` to `path` of a listening `app` on a raw socket and leaves at once, then lets
 * `release` go once the server saw the caller go: whatever the request was waiting for (its
 * authorization, its payment) answers after the caller left.
 */
async function leaveWhileWaiting(
  app: FastifyInstance,
  path: string,
  headers: Record<string, string>,
  body: unknown,
  release: () => void,
): Promise<void> {
  await app.listen({ port: 0, host: "127.0.0.1" });
  const { port } = app.server.address() as { port: number };
  const closed = new Promise((r) => app.server.once("request", (_req, res) => res.once("close", r)));
  const text = JSON.stringify(body);
  const head = Object.entries({ ...headers, "content-length": String(Buffer.byteLength(text)) })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("");
  const socket = connect(port, "127.0.0.1", () => {
    socket.end(`POST ${path} HTTP/1.1\r\nHost: x\r\n${head}\r\n${text}`);
    socket.destroy();
  });
  socket.on("error", () => {});
  await closed;
  release();
}

describe('a caller that leaves while its key is checked (docs/money.md, "An answer written as its caller leaves")', () => {
  it.each([
    ["buffered", false],
    ["streamed", true],
  ])("%s: no model runs and the hold goes back at once", async (_label, stream) => {
    const { app, f } = edge();
    const { wait, open: authorized } = gate();
    f.authWaits = wait;
    await leaveWhileWaiting(
      app,
      ROUTES.chat.path,
      { ...json, ...bearer() },
      { ...(BODIES.chat as object), ...(stream ? { stream: true } : {}) },
      authorized,
    );
    await expect.poll(() => f.settled).toEqual(["0"]);
    expect(f.routerCalls ?? 0).toBe(0);
  });
});

describe('a stream its caller cuts before the router\'s first event (docs/money.md, "Holds")', () => {
  // The router's call ends CANCELLED: api-edge cancelled it as its caller went. The router then
  // records the stream at what was produced (zero here), under the reservation it was given, and
  // metering's settlement of that event ends the hold: api-edge gives nothing back itself, so the
  // hold is ended once, by that one event.
  const cancelled = () => new RemoteError(GrpcStatus.CANCELLED, undefined, "cancelled by the caller");
  const chatStream = () =>
    request("chat", { payload: JSON.stringify({ ...(BODIES.chat as object), stream: true }) });

  it("authorized alone: api-edge neither settles nor releases the hold the router's event ends", async () => {
    const { app, f } = edge();
    f.inferenceFails = cancelled();
    await app.inject(chatStream());
    expect(f.streamReservations).toEqual(["res_1"]);
    expect(f.settled).toEqual([]);
  });

  it("on a lease: its ticket goes back unsure, the one the router's event names, its quote still committed", async () => {
    const { app, f, leases } = edge({ withLeases: true });
    f.leaseBudget = 100_000n;
    f.inferenceFails = cancelled();
    await app.inject(chatStream());
    expect(f.authorized).toEqual([]);
    expect(f.streamReservations).toEqual(["lease_1~1"]);
    await leases!.close();
    expect(f.settled).toEqual([]);
    // Its quote (input 1 unit a token) stays committed until the router's event charges the ticket.
    const quote = f.returnedUnsure[0]?.[0]?.quote;
    expect(f.returnedUnsure).toEqual([[{ ticket: 1, quote }]]);
    expect(f.returned).toEqual([quote]);
    expect(BigInt(quote ?? "0")).toBeGreaterThan(0n);
  });
});

describe("POST /v1/embeddings", () => {
  const post = (payload: unknown) => request("embeddings", { payload: JSON.stringify(payload) });

  it("answers the router's list of embeddings as JSON, with the money headers", async () => {
    const { app, f } = edge();
    const res = await app.inject(post({ model: "embed", input: ["one", "two"], encoding_format: "float" }));
    expect(res.statusCode, res.body).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^application\/json/);
    expect(res.json()).toEqual(EMBED_ANSWER);
    // The quote held (50) became the cost (7): 950 left after the hold, 993 once settled.
    expect(res.headers["x-tollgate-cost"]).toBe("7");
    expect(res.headers["x-tollgate-budget-remaining"]).toBe("993");
    expect(f.settled).toEqual(["7"]);
    expect(f.authorized).toEqual([Route.EMBEDDINGS]);
    expect(f.asked).toEqual([
      expect.objectContaining({ maxOutputTokens: 0, messageCount: 2, checkOnly: false }),
    ]);
    expect(f.completed).toHaveLength(1);
    expect(f.completed[0]).toMatchObject({
      operation: Operation.EMBEDDINGS,
      model: "embed",
      maxOutputTokens: 0,
    });
  });

  it.each([
    ["a string", "hello", 1],
    ["one token list", [1, 2, 3], 1],
    ["token lists", [[1], [2, 3], [4]], 3],
    [`${2048} strings`, Array.from({ length: 2048 }, () => "x"), 2048],
  ])("counts the inputs of %s for the quote", async (_what, input, count) => {
    const { app, f } = edge();
    const res = await app.inject(post({ model: "embed", input }));
    expect(res.statusCode, res.body).toBe(200);
    expect(f.asked[0]?.messageCount).toBe(count);
  });

  it.each([
    ["more than 2048 inputs", { input: Array.from({ length: 2049 }, () => "x") }],
    ["an empty string", { input: "" }],
    ["an empty list", { input: [] }],
    ["an empty token list among lists", { input: [[1], []] }],
    ["a negative token id", { input: [1, -2] }],
    ["mixed strings and tokens", { input: ["a", 1] }],
    ["no model", { model: undefined }],
    ["an unknown encoding", { encoding_format: "int8" }],
    ["zero dimensions", { dimensions: 0 }],
    ["an output cap", { max_tokens: 16 }],
    ["stream", { stream: true }],
  ])("refuses %s with 400 invalid_request, holding nothing", async (_what, over) => {
    const { app, f } = edge();
    const res = await app.inject(post({ model: "embed", input: "hello", ...over }));
    expect(res.statusCode).toBe(400);
    expect(code(res)).toBe("invalid_request");
    expect(f.asked).toEqual([expect.objectContaining({ checkOnly: true })]);
    expect(f.completed).toEqual([]);
    expect(f.settled).toEqual([]);
  });

  it("answers 400 model_kind_mismatch for a chat model, and gives the hold back", async () => {
    const { app, f } = edge();
    f.inferenceFails = new RemoteError(
      GrpcStatus.INVALID_ARGUMENT,
      "model_kind_mismatch",
      "the model 'small' is not an embedding model",
    );
    const res = await app.inject(post({ model: "small", input: "hello" }));
    expect(res.statusCode).toBe(400);
    expect(code(res)).toBe("model_kind_mismatch");
    expect(res.headers["x-tollgate-cost"]).toBeUndefined();
    expect(f.settled).toEqual(["0"]);
  });
});

describe("paths and methods", () => {
  it("answers 404 not_found on an unknown path", async () => {
    const { app } = edge();
    const res = await app.inject({ method: "GET", url: "/v1/nothing", headers: bearer() });
    expect(res.statusCode).toBe(404);
    expect(code(res)).toBe("not_found");
  });

  it.each([
    ["GET", "/v1/chat/completions", "POST"],
    ["PUT", "/v1/completions", "POST"],
    ["DELETE", "/v1/responses", "POST"],
    ["GET", "/v1/think", "POST"],
    ["POST", "/v1/models", "GET, HEAD"],
    ["DELETE", "/v1/models/small", "GET, HEAD"],
    ["GET", "/v1/mpp/chat/completions", "POST"],
    ["TRACE", "/v1/chat/completions", "POST"],
    ["TRACE", "/v1/models", "GET, HEAD"],
    ["POST", "/livez", "GET, HEAD"],
  ] as const)("answers %s %s with 405 method_not_allowed and Allow: %s", async (method, url, allow) => {
    const { app, f } = edge();
    const res = await app.inject({ method, url, headers: bearer() });
    expect(res.statusCode).toBe(405);
    expect(code(res)).toBe("method_not_allowed");
    expect(res.headers.allow).toBe(allow);
    // Refused before the key is checked or anything is taken.
    expect(f.authorized).toEqual([]);
  });

  it("answers 405 before reading a body the route would refuse", async () => {
    const { app } = edge();
    const res = await app.inject({
      method: "PUT",
      url: "/v1/chat/completions",
      headers: { "content-type": "text/plain" },
      payload: "hello",
    });
    expect(res.statusCode).toBe(405);
    expect(res.headers.allow).toBe("POST");
  });

  it("answers another method on the paid route with 405 as problem details, as every paid-route error", async () => {
    const { app } = edge();
    for (const method of ["GET", "PUT", "DELETE"] as const) {
      const res = await app.inject({ method, url: "/v1/mpp/chat/completions" });
      expect(res.statusCode, method).toBe(405);
      expect(res.headers["content-type"]).toMatch(/^application\/problem\+json/);
      expect(res.json()).toMatchObject({ status: 405, code: "method_not_allowed" });
      expect(res.headers.allow).toBe("POST");
    }
  });

  it("answers every other HTTP method Node parses (WebDAV, QUERY, ...) on a route's path with 405, in the route's shape", async () => {
    const { app, f } = edge();
    for (const method of ["PROPFIND", "SEARCH", "QUERY", "PURGE", "REPORT", "LOCK", "MKCOL"] as const) {
      const chat = await app.inject({ method, url: "/v1/chat/completions", headers: bearer() });
      expect(chat.statusCode, method).toBe(405);
      expect(code(chat), method).toBe("method_not_allowed");
      expect(chat.headers.allow).toBe("POST");
      expect(chat.headers["x-request-id"]).toMatch(/.+/);
      const models = await app.inject({ method, url: "/v1/models/small", headers: bearer() });
      expect(models.statusCode, method).toBe(405);
      expect(models.headers.allow).toBe("GET, HEAD");
      const paid = await app.inject({ method, url: "/v1/mpp/chat/completions" });
      expect(paid.statusCode, method).toBe(405);
      expect(paid.headers["content-type"]).toMatch(/^application\/problem\+json/);
      expect(paid.json()).toMatchObject({ status: 405, code: "method_not_allowed" });
      const messages = await app.inject({ method, url: "/v1/messages" });
      expect(messages.statusCode, method).toBe(405);
      expect(messages.json()).toMatchObject({ type: "error", error: { code: "method_not_allowed" } });
      // Still a 404 where no route is (QUERY needs a Content-Type to be read at all, RFC 10008).
      const none = await app.inject({
        method,
        url: "/v1/nothing",
        headers: { "content-type": "application/json" },
        payload: "{}",
      });
      expect(none.statusCode, method).toBe(404);
    }
    expect(f.authorized).toEqual([]);
  });

  it("answers HEAD on a POST route with 405 and no body, and OPTIONS with 204 and Allow", async () => {
    const { app } = edge();
    const head = await app.inject({ method: "HEAD", url: "/v1/chat/completions" });
    expect(head.statusCode).toBe(405);
    expect(head.headers.allow).toBe("POST");
    expect(head.body).toBe("");
    const options = await app.inject({ method: "OPTIONS", url: "/v1/think" });
    expect(options.statusCode).toBe(204);
    expect(options.headers.allow).toBe("POST");
  });

  it("gives every route of the table its method, and the paid path none when the paid door is off", async () => {
    const { app } = edge({ withPayment: false });
    const res = await app.inject(request("mppChat"));
    expect(res.statusCode).toBe(404);
    for (const id of ROUTE_IDS.filter((r) => r !== "mppChat")) {
      const spec: RouteSpec = ROUTES[id];
      expect(app.hasRoute({ method: spec.method, url: spec.path }), id).toBe(true);
    }
  });
});

describe("GET /v1/models/{model}", () => {
  it("answers a model the key may use as in the list, pricing included", async () => {
    const { app } = edge();
    const list = (await app.inject(request("models"))).json() as { data: unknown[] };
    const one = await app.inject({ method: "GET", url: "/v1/models/small", headers: bearer() });
    expect(one.statusCode).toBe(200);
    expect(one.json()).toEqual(list.data[0]);
    expect(one.json()).toMatchObject({
      id: "small",
      object: "model",
      pricing: { input_per_million: "100", output_per_million: "200", currency_decimals: 6 },
    });
  });

  it("answers a model hidden from the key exactly as one that does not exist", async () => {
    const { app } = edge();
    const hidden = await app.inject({ method: "GET", url: "/v1/models/secret-model", headers: bearer() });
    const none = await app.inject({ method: "GET", url: "/v1/models/no-such-model", headers: bearer() });
    for (const res of [hidden, none]) {
      expect(res.statusCode).toBe(404);
      expect(code(res)).toBe("not_found");
    }
    const strip = (b: string) => ({ ...(JSON.parse(b) as { error: object }).error, request_id: "" });
    expect(strip(hidden.body)).toEqual(strip(none.body));
  });

  it("asks auth-policy as the models route, so a key limited to other routes is refused alike", async () => {
    const { app, f } = edge();
    await app.inject({ method: "GET", url: "/v1/models/small", headers: bearer() });
    expect(f.authorized).toEqual([Route.MODELS]);
  });
});

describe("a chat template of the request's own", () => {
  it.each([
    ["chat_template", { chat_template: "{% for i in range(100000) %}word {% endfor %}" }],
    ["chat_template_kwargs.chat_template", { chat_template_kwargs: { chat_template: "{{ 'x' * 100000 }}" } }],
  ] as const)(
    "refuses %s with 400 invalid_request on both doors, holding nothing and forwarding nothing",
    async (_, fields) => {
      for (const id of ["chat", "mppChat"] as const) {
        const { app, f } = edge();
        const res = await app.inject(
          request(id, { payload: JSON.stringify({ ...(BODIES[id] as object), ...fields }) }),
        );
        expectRefusedBody(res, f, /chat template/);
      }
    },
  );

  it("serves the template's arguments (chat_template_kwargs) and a null chat_template", async () => {
    const { app } = edge();
    const res = await app.inject(
      request("chat", {
        payload: JSON.stringify({
          ...(BODIES.chat as object),
          chat_template: null,
          chat_template_kwargs: { enable_thinking: false },
        }),
      }),
    );
    expect(res.statusCode, res.body).toBe(200);
  });
});

describe("a chat message without content", () => {
  it.each([["user"], ["system"], ["developer"], ["tool"]] as const)(
    "refuses a %s message with no content (or null) with 400 naming the field, on both doors, forwarding nothing",
    async (role) => {
      for (const id of ["chat", "mppChat"] as const) {
        for (const content of [{}, { content: null }]) {
          const { app, f } = edge();
          const body = {
            ...(BODIES[id] as object),
            messages: [
              { role: "user", content: "Hi" },
              { role, ...content },
            ],
          };
          const res = await app.inject(request(id, { payload: JSON.stringify(body) }));
          expectRefusedBody(res, f, /messages\.1\.content/);
        }
      }
    },
  );

  it("serves an earlier assistant turn without content (beside its tool calls)", async () => {
    const { app } = edge();
    const body = {
      ...(BODIES.chat as object),
      messages: [
        { role: "user", content: "Hi" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }],
        },
        { role: "tool", tool_call_id: "c1", content: "42" },
      ],
    };
    const res = await app.inject(request("chat", { payload: JSON.stringify(body) }));
    expect(res.statusCode, res.body).toBe(200);
  });
});

describe("chat content parts", () => {
  const withParts = (id: "chat" | "mppChat", content: unknown) =>
    request(id, {
      payload: JSON.stringify({ ...(BODIES[id] as object), messages: [{ role: "user", content }] }),
    });

  it.each([
    ["an image", { type: "image_url", image_url: { url: "https://example.com/huge.png", detail: "high" } }],
    ["audio", { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }],
    ["a file", { type: "file", file: { file_id: "file-1" } }],
  ] as const)(
    "refuses %s part with 400 invalid_request on both doors, holding nothing and quoting nothing",
    async (_, part) => {
      for (const id of ["chat", "mppChat"] as const) {
        const { app, f } = edge();
        const res = await app.inject(withParts(id, [{ type: "text", text: "what is this?" }, part]));
        expectRefusedBody(res, f, /only text content parts/);
        expect(res.headers["www-authenticate"]).toBeUndefined();
      }
    },
  );

  it("serves text parts (and an earlier assistant turn's refusal part)", async () => {
    const { app } = edge();
    const res = await app.inject(
      request("chat", {
        payload: JSON.stringify({
          model: "small",
          messages: [
            { role: "user", content: [{ type: "text", text: "hello" }] },
            { role: "assistant", content: [{ type: "refusal", refusal: "no" }] },
            { role: "user", content: [{ type: "text", text: "please" }] },
          ],
        }),
      }),
    );
    expect(res.statusCode, res.body).toBe(200);
  });
});

/** A request to the paid route with a Payment credential, its body changed by `over`. */
function paid(over: Record<string, unknown> = {}): InjectOptions {
  const req = request("mppChat");
  return {
    ...req,
    headers: { ...(req.headers as object), authorization: "Payment abc" },
    payload: { ...(BODIES.mppChat as object), ...over },
  };
}

describe("the paid route", () => {
  it("answers an unpaid request with 402 payment_required and a challenge", async () => {
    const { app } = edge();
    const res = await app.inject(request("mppChat"));
    expect(res.statusCode).toBe(402);
    expect(res.headers["www-authenticate"]).toMatch(/^Payment /);
    expect(res.headers["content-type"]).toMatch(/^application\/problem\+json/);
    expect(res.json()).toMatchObject({ code: "payment_required", error: { code: "payment_required" } });
  });

  it("passes on when a cooled-down model comes back (Retry-After), with the accepted receipt", async () => {
    const { app, f } = edge();
    f.inferenceFails = new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "cooled down", {
      [INFERENCE_DETAILS.retryAfter]: "7",
    });
    const res = await app.inject(paid());
    expect(res.statusCode).toBe(502);
    expect(res.json()).toMatchObject({ code: "upstream_error" });
    expect(res.headers["retry-after"]).toBe("7");
    expect(res.headers["payment-receipt"]).toBe("accepted-receipt");
  });

  it.each([
    "upstream_rejected",
    "upstream_error",
    "upstream_timeout",
    "model_not_found",
    "usage_not_recorded",
  ] as const)(
    "answers the router's %s as the paid door's table says, charging nothing",
    async (errorCode) => {
      const { app, f } = edge();
      const spec = ERRORS[errorCode];
      f.inferenceFails = new RemoteError(GrpcStatus[spec.grpc!], errorCode, "the router failed");
      const res = await app.inject(paid());
      expect(res.statusCode).toBe(spec.http);
      expect(res.headers["content-type"]).toMatch(/^application\/problem\+json/);
      expect(res.json()).toMatchObject({ code: errorCode });
      expect(res.headers["payment-receipt"]).toBe("accepted-receipt");
      expect(f.released).toEqual(["hold_1"]);
      // docs/paid-door.md, "Errors" lists the codes whose catalogue entry gives the paid door.
      expect(spec.doors).toContain("paid");
    },
  );

  it("answers a body refused after its credential was accepted with the refusal, giving the hold back", async () => {
    const { app, f } = edge();
    const res = await app.inject(paid({ stream: true }));
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: "mpp_streaming_unavailable" });
    expect(res.headers["payment-receipt"]).toBe("accepted-receipt");
    expect(f.released).toEqual(["hold_1"]);
    expect(f.forwarded).toEqual([]);
  });

  it("answers a refused credential first, whatever its body", async () => {
    const { app, f } = edge();
    f.verifyFails = new RemoteError(GrpcStatus.FAILED_PRECONDITION, "mpp_invalid_challenge", "replayed");
    const res = await app.inject(paid({ stream: true }));
    expect(res.statusCode).toBe(402);
    expect(res.json()).toMatchObject({ code: "mpp_invalid_challenge" });
    expect(f.released).toEqual([]);
    expect(f.forwarded).toEqual([]);
  });

  it("answers a Virtual Key beside a payment credential with 401 wrong_auth_scheme, charging nothing", async () => {
    const { app, f } = edge();
    for (const field of ["x-api-key", "api-key"]) {
      const req = paid();
      const res = await app.inject({ ...req, headers: { ...(req.headers as object), [field]: GOOD_KEY } });
      expect(res.statusCode, field).toBe(401);
      expect(res.json()).toMatchObject({ code: "wrong_auth_scheme" });
    }
    expect(f.forwarded).toEqual([]);
  });

  it("refuses a close credential sent with a body (400), closing nothing; the same credential bodyless closes", async () => {
    const { app, f } = edge();
    f.verifyAction = Action.CLOSE;
    const withBody = await app.inject(paid());
    expect(withBody.statusCode).toBe(400);
    expect(withBody.json()).toMatchObject({
      code: "invalid_request",
      detail: expect.stringMatching(/no body/),
    });
    expect(f.closed).toEqual([]);
    expect(f.forwarded).toEqual([]);
    const { payload: _body, ...bodyless } = paid();
    const closed = await app.inject(bodyless);
    expect(closed.statusCode).toBe(204);
    expect(closed.headers["payment-receipt"]).toBe("close-receipt");
    expect(f.closed).toEqual(["0xchannel"]);
  });

  it("answers a Bearer key beside a payment credential in the same header with 401 wrong_auth_scheme", async () => {
    const { app, f } = edge();
    for (const authorization of [
      `Bearer ${GOOD_KEY}, Payment abc`,
      `Payment abc, Bearer ${GOOD_KEY}`,
      "Payment abc,bearer nope",
    ]) {
      const req = paid();
      const res = await app.inject({ ...req, headers: { ...(req.headers as object), authorization } });
      expect(res.statusCode, authorization).toBe(401);
      expect(res.json()).toMatchObject({ code: "wrong_auth_scheme" });
    }
    expect(f.forwarded).toEqual([]);
    expect(f.released).toEqual([]);
  });

  it("answers a Virtual Key with a body that is not JSON with 401 wrong_auth_scheme", async () => {
    const { app } = edge();
    const res = await app.inject({
      ...request("mppChat"),
      headers: { ...json, ...bearer() },
      payload: "{not",
    });
    expect(res.statusCode).toBe(401);
    expect(res.json()).toMatchObject({ code: "wrong_auth_scheme" });
  });

  it("answers a payment credential with a body that is not JSON with 400 invalid_json, holding nothing", async () => {
    const { app, f } = edge();
    const req = paid();
    const res = await app.inject({ ...req, payload: "{not" });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({ code: "invalid_json" });
    expect(f.forwarded).toEqual([]);
    expect(f.released).toEqual([]);
  });

  it("runs no model for a caller that left while its payment was verified, and gives the hold back", async () => {
    const { app, f } = edge();
    const { wait, open: verified } = gate();
    f.verifyWaits = wait;
    await leaveWhileWaiting(
      app,
      ROUTES.mppChat.path,
      { ...json, authorization: "Payment abc" },
      BODIES.mppChat,
      verified,
    );
    await expect.poll(() => f.released).toEqual(["hold_1"]);
    expect(f.routerCalls ?? 0).toBe(0);
  });

  it("answers a Virtual Key with 401 wrong_auth_scheme", async () => {
    const { app } = edge();
    const req = request("mppChat");
    const res = await app.inject({ ...req, headers: { ...(req.headers as object), ...bearer() } });
    expect(res.statusCode).toBe(401);
    expect(res.json()).toMatchObject({ code: "wrong_auth_scheme" });
  });
});

describe("POST /v1/responses with item references to earlier answers (stored unless store: false)", () => {
  const ask = (input: unknown, over: object = {}, key = GOOD_KEY): InjectOptions => ({
    ...request("responses", { payload: JSON.stringify({ model: "small", input, ...over }) }),
    headers: { ...bearer(key), ...json },
  });
  /** The first turn's answer: its output message id. */
  const firstTurn = async (app: FastifyInstance, over: object = {}, key = GOOD_KEY) => {
    const res = await app.inject(ask("What is a tollgate?", over, key));
    expect(res.statusCode, res.body).toBe(200);
    return res.json().output[0].id as string;
  };
  const secondTurn = (id: string) => [
    { role: "user", content: "What is a tollgate?" },
    { type: "item_reference", id },
    { role: "user", content: "And a toll?" },
  ];

  it("sends the referenced answer to the model as the assistant's message, and counts it in the quote", async () => {
    const { app, f } = edge();
    const id = await firstTurn(app);
    expect(id).toMatch(/^msg_/);
    const payload = JSON.stringify({ model: "small", input: secondTurn(id) });
    const res = await app.inject(ask(secondTurn(id)));
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ status: "completed", output_text: "hi" });
    const forwarded = JSON.parse(Buffer.from(f.completed.at(-1)!.body).toString("utf8"));
    expect(forwarded.messages).toEqual([
      { role: "user", content: "What is a tollgate?" },
      { role: "assistant", content: CHAT_ANSWER.choices[0]!.message.content },
      { role: "user", content: "And a toll?" },
    ]);
    // The quote sees the body's bytes and the referenced answer's text ("hi": 2 bytes).
    const second = f.asked.at(-1)!;
    expect(second.bodyBytes).toBe(Buffer.byteLength(payload) + 2);
    expect(second.estimatedInputTokens).toBe(Math.ceil((Buffer.byteLength(payload) + 2) / 4));
    expect(second.messageCount).toBe(3);
  });

  it("counts the referenced text in a lease's quote too: a lease the body alone fits does not admit it", async () => {
    for (const short of [1n, 0n]) {
      const { app, f } = edge({ withLeases: true });
      const id = await firstTurn(app);
      const payload = JSON.stringify({ model: "small", input: secondTurn(id) });
      // The quote at 1 unit an input token: body bytes, the answer's 2, 8 a message and 16.
      f.leaseBudget = BigInt(Buffer.byteLength(payload) + 2 + 8 * 3 + 16) - short;
      const before = f.asked.length;
      const res = await app.inject(ask(secondTurn(id)));
      expect(res.statusCode, res.body).toBe(200);
      // A lease one unit short does not admit it (authorized on its own); one of the quote does.
      expect(f.asked.length - before).toBe(short > 0n ? 1 : 0);
    }
  });

  it("keeps a streamed answer too, with the whole text", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo"];
    const first = await app.inject(ask("hello", { stream: true }));
    expect(first.statusCode, first.body).toBe(200);
    const done = sseEvents(first.body).find((e) => e.event === "response.completed")!;
    const id = (done.data.response as { output: { id: string }[] }).output[0]!.id;
    const res = await app.inject(ask(secondTurn(id)));
    expect(res.statusCode, res.body).toBe(200);
    const forwarded = JSON.parse(Buffer.from(f.completed.at(-1)!.body).toString("utf8"));
    expect(forwarded.messages[1]).toEqual({ role: "assistant", content: "Hello" });
  });

  it("refuses an unknown or expired id with a 400 naming its place, the key checked and nothing held", async () => {
    const { app, f } = edge();
    const res = await app.inject(ask(secondTurn("msg_never")));
    expect(res.statusCode).toBe(400);
    expect(code(res)).toBe("invalid_request");
    expect(res.json().error.message).toMatch(/^input: 1: item_reference "msg_never" is unknown or expired/);
    expect(res.json().error.message).toContain("store: false");
    expect(f.asked.map((a) => a.checkOnly)).toEqual([true]);
    expect(f.completed).toHaveLength(0);
    const unauthenticated = await app.inject(ask(secondTurn("msg_never"), {}, BAD_KEY));
    expect(unauthenticated.statusCode).toBe(401);
  });

  it("never lets another account read an answer: its id is unknown there, and the hold goes back", async () => {
    const { app, f } = edge();
    const id = await firstTurn(app);
    const settledBefore = f.settled.length;
    const res = await app.inject(ask(secondTurn(id), {}, OTHER_KEY));
    expect(res.statusCode).toBe(400);
    expect(res.json().error.message).toContain(`item_reference "${id}" is unknown or expired`);
    expect(f.completed).toHaveLength(1);
    expect(f.settled.slice(settledBefore)).toEqual(["0"]);
  });

  it("keeps nothing of an answer asked with store: false", async () => {
    const { app, f } = edge();
    const id = await firstTurn(app, { store: false });
    f.streamTexts = ["x"];
    const streamed = await app.inject(ask("hello", { stream: true, store: false }));
    const done = sseEvents(streamed.body).find((e) => e.event === "response.completed")!;
    const streamedId = (done.data.response as { output: { id: string }[] }).output[0]!.id;
    for (const ref of [id, streamedId]) {
      const res = await app.inject(ask(secondTurn(ref)));
      expect(res.statusCode).toBe(400);
      expect(res.json().error.message).toContain("unknown or expired");
    }
  });
});

describe("POST /v1/responses with stream: true", () => {
  const streamed = (over: object = {}) =>
    request("responses", {
      payload: JSON.stringify({ model: "small", input: "hello", stream: true, ...over }),
    });

  it("answers the Responses event sequence, one text delta per upstream chunk, numbered in order", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo", " there"];
    const res = await app.inject(streamed());
    expect(res.statusCode, res.body).toBe(200);
    const events = sseEvents(res.body);
    expect(events.map((e) => e.event)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    // Each event's type is its event name; sequence numbers count from 0 without a gap.
    expect(events.map((e) => e.data.type)).toEqual(events.map((e) => e.event));
    expect(events.map((e) => e.data.sequence_number)).toEqual(events.map((_, i) => i));
    expect(res.body).not.toContain("[DONE]");
    const deltas = events.filter((e) => e.event === "response.output_text.delta").map((e) => e.data.delta);
    expect(deltas).toEqual(["Hel", "lo", " there"]);
    expect(events[7]?.data.text).toBe("Hello there");
    expect(events[0]?.data.response).toMatchObject({ status: "in_progress", output: [], usage: null });
    const final = events.at(-1)!.data;
    expect(final.response).toMatchObject({
      object: "response",
      status: "completed",
      model: "small",
      output_text: "Hello there",
      output: [
        { type: "message", status: "completed", content: [{ type: "output_text", text: "Hello there" }] },
      ],
      usage: { input_tokens: 3, output_tokens: 3, total_tokens: 6 },
    });
    // The cost, as a chat stream's usage chunk carries it, and the settled budget left.
    expect(final.x_tollgate).toEqual({ cost: "7", budget_remaining: "993" });
    expect(res.trailers["x-tollgate-cost"]).toBe("7");
    expect(f.settled).toEqual(["7"]);
  });

  it("asks the router for a chat stream of the translated request", async () => {
    const { app, f } = edge();
    await app.inject(streamed({ instructions: "be brief", max_output_tokens: 20 }));
    expect(f.forwarded).toEqual([
      {
        model: "small",
        messages: [
          { role: "system", content: "be brief" },
          { role: "user", content: "hello" },
        ],
        max_tokens: 20,
      },
    ]);
  });

  it("ends an answer cut by the output cap with response.incomplete, as OpenAI does", async () => {
    const { app, f } = edge();
    f.streamFinish = "length";
    const res = await app.inject(streamed({ max_output_tokens: 1 }));
    const final = sseEvents(res.body).at(-1)!;
    expect(final.event).toBe("response.incomplete");
    expect(final.data.response).toMatchObject({
      status: "incomplete",
      incomplete_details: { reason: "max_output_tokens" },
      usage: { output_tokens: 1 },
    });
    expect(final.data.x_tollgate).toEqual({ cost: "7", budget_remaining: "993" });
  });

  it("ends a stream whose upstream dies mid-way with response.failed, the text so far kept", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo"];
    f.streamCut = new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "connection reset");
    const res = await app.inject(streamed());
    expect(res.statusCode).toBe(200);
    const events = sseEvents(res.body);
    expect(events.map((e) => e.event).slice(-3)).toEqual([
      "response.output_text.delta",
      "response.output_text.delta",
      "response.failed",
    ]);
    const failed = events.at(-1)!.data;
    expect(failed.sequence_number).toBe(events.length - 1);
    expect(failed.response).toMatchObject({
      status: "failed",
      error: { code: "upstream_error" },
      output: [{ status: "incomplete", content: [{ text: "Hello" }] }],
    });
    // No cost was settled by the edge: the router bills what was produced (docs/money.md), and
    // the caller is told that charge (cost 2: the usage so far of the second chunk).
    expect(f.settled).toEqual([]);
    expect(failed.x_tollgate).toEqual({ cost: "2", budget_remaining: "998" });
    expect(res.trailers["x-tollgate-cost"]).toBe("2");
  });

  it("answers a stream the router refuses before its first event as JSON, and gives the hold back", async () => {
    const { app, f } = edge();
    f.inferenceFails = new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "bad gateway");
    const res = await app.inject(streamed());
    expect(res.statusCode).toBe(502);
    expect(code(res)).toBe("upstream_error");
    expect(f.settled).toEqual(["0"]);
  });
});

describe("POST /v1/responses with text.format and metadata", () => {
  const format = {
    type: "json_schema",
    name: "place",
    schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    strict: true,
  };
  const metadata = { user: "u1" };
  const ask = (over: object = {}) =>
    request("responses", { payload: JSON.stringify({ model: "small", input: "hello", ...over }) });

  it("forwards the format as the chat response_format, echoes it and metadata, and quotes the caller's body", async () => {
    const { app, f } = edge();
    const payload = JSON.stringify({ model: "small", input: "hello", text: { format }, metadata });
    const res = await app.inject(ask({ text: { format }, metadata }));
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ text: { format }, metadata });
    const forwarded = JSON.parse(Buffer.from(f.completed.at(-1)!.body).toString("utf8"));
    const { type, ...jsonSchema } = format;
    expect(forwarded.response_format).toEqual({ type, json_schema: jsonSchema });
    expect(forwarded).not.toHaveProperty("text");
    expect(forwarded).not.toHaveProperty("metadata");
    // The quote counts the bytes the caller sent (the schema included), not the translation's.
    expect(f.asked.at(-1)?.bodyBytes).toBe(Buffer.byteLength(payload));
  });

  it("echoes them on a stream's response.created and response.completed", async () => {
    const { app, f } = edge();
    const res = await app.inject(ask({ stream: true, text: { format: { type: "json_object" } }, metadata }));
    expect(res.statusCode, res.body).toBe(200);
    expect(f.forwarded).toEqual([expect.objectContaining({ response_format: { type: "json_object" } })]);
    const events = sseEvents(res.body);
    for (const name of ["response.created", "response.completed"]) {
      const event = events.find((e) => e.event === name);
      expect(event?.data.response).toMatchObject({ text: { format: { type: "json_object" } }, metadata });
    }
  });

  it("refuses a format or metadata it cannot take with a 400 naming the field, nothing held", async () => {
    for (const over of [
      { text: { format: { type: "json_schema", name: "place" } } },
      { metadata: { user: 1 } },
    ]) {
      const { app, f } = edge();
      const res = await app.inject(ask(over));
      expect(res.statusCode).toBe(400);
      expect(code(res)).toBe("invalid_request");
      expect(res.json().error.message).toMatch(/^(text\.format\.schema|metadata\.user): /);
      expect(f.asked.map((a) => a.checkOnly)).toEqual([true]);
      expect(f.completed).toHaveLength(0);
    }
  });
});

describe("POST /v1/messages (Anthropic Messages)", () => {
  const anthropic = (key = GOOD_KEY) => ({ "x-api-key": key, "anthropic-version": "2023-06-01", ...json });
  const messages = (body: object = {}, headers: Record<string, string> = anthropic()): InjectOptions => ({
    method: "POST",
    url: "/v1/messages",
    headers,
    payload: JSON.stringify({
      model: "small",
      max_tokens: 16,
      messages: [{ role: "user", content: "hello" }],
      ...body,
    }),
  });

  it("answers an Anthropic SDK's request (x-api-key) with a message, its usage and its cost", async () => {
    const { app, f } = edge();
    const res = await app.inject(messages());
    expect(res.statusCode, res.body).toBe(200);
    const body = res.json() as Record<string, unknown>;
    expect(body).toEqual({
      id: expect.stringMatching(/^msg_/),
      type: "message",
      role: "assistant",
      content: [{ type: "text", text: "hi" }],
      model: "small",
      stop_reason: "end_turn",
      stop_sequence: null,
      usage: { input_tokens: 3, output_tokens: 1 },
    });
    expect(res.headers["x-tollgate-cost"]).toBe("7");
    expect(f.authorized).toEqual([Route.CHAT_COMPLETIONS]);
  });

  it("forwards the translated chat request: system first, text blocks, max_tokens as the cap, stop sequences", async () => {
    const { app, f } = edge();
    await app.inject(
      messages({
        stream: true,
        system: [{ type: "text", text: "be brief" }],
        messages: [
          { role: "user", content: [{ type: "text", text: "hello" }] },
          { role: "assistant", content: "hi" },
          { role: "user", content: "again" },
        ],
        temperature: 0.5,
        top_p: 0.9,
        stop_sequences: ["END"],
        metadata: { user_id: "u1" },
      }),
    );
    expect(f.forwarded).toEqual([
      {
        model: "small",
        messages: [
          { role: "system", content: "be brief" },
          { role: "user", content: [{ type: "text", text: "hello" }] },
          { role: "assistant", content: "hi" },
          { role: "user", content: "again" },
        ],
        max_tokens: 16,
        temperature: 0.5,
        top_p: 0.9,
        stop: ["END"],
      },
    ]);
  });

  it("accepts the key as Authorization: Bearer too", async () => {
    const { app } = edge();
    const res = await app.inject(messages({}, { ...bearer(), ...json }));
    expect(res.statusCode).toBe(200);
  });

  it("streams Anthropic's event sequence, one text delta per upstream chunk, usage and cost in message_delta", async () => {
    const { app, f } = edge();
    f.streamTexts = ["Hel", "lo"];
    const res = await app.inject(messages({ stream: true }));
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-type"]).toMatch(/^text\/event-stream/);
    const events = sseEvents(res.body);
    expect(events.map((e) => e.event)).toEqual([
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    expect(events.map((e) => e.data.type)).toEqual(events.map((e) => e.event));
    expect(events[0]?.data.message).toMatchObject({
      type: "message",
      role: "assistant",
      content: [],
      model: "small",
    });
    expect(events.slice(2, 4).map((e) => e.data.delta)).toEqual([
      { type: "text_delta", text: "Hel" },
      { type: "text_delta", text: "lo" },
    ]);
    expect(events[5]?.data).toEqual({
      type: "message_delta",
      delta: { stop_reason: "end_turn", stop_sequence: null },
      usage: { input_tokens: 3, output_tokens: 2 },
      x_tollgate: { cost: "7", budget_remaining: "993" },
    });
    expect(res.trailers["x-tollgate-cost"]).toBe("7");
    expect(f.settled).toEqual(["7"]);
  });

  it("reports an answer cut by max_tokens as stop_reason max_tokens", async () => {
    const { app, f } = edge();
    f.streamFinish = "length";
    const res = await app.inject(messages({ stream: true }));
    expect(sseEvents(res.body)[4]?.data.delta).toEqual({ stop_reason: "max_tokens", stop_sequence: null });
  });

  it("ends a stream whose upstream dies mid-way with an Anthropic error event", async () => {
    const { app, f } = edge();
    f.streamCut = new RemoteError(GrpcStatus.UNAVAILABLE, "upstream_error", "connection reset");
    const res = await app.inject(messages({ stream: true }));
    const last = sseEvents(res.body).at(-1)!;
    expect(last.event).toBe("error");
    expect(last.data).toMatchObject({
      type: "error",
      error: { type: "api_error", code: "upstream_error" },
      x_tollgate: { cost: "1", budget_remaining: "999" },
    });
    expect(res.trailers["x-tollgate-cost"]).toBe("1");
    expect(f.settled).toEqual([]);
  });

  const anthropicError = (res: { json(): unknown }) =>
    res.json() as { type: string; error: { type: string; message: string; code: string } };

  it.each([
    ["no key", {}, "missing_api_key", /x-api-key/],
    ["a key auth-policy refuses", { "x-api-key": BAD_KEY }, "invalid_api_key", /not valid/],
    ["a Payment credential", { authorization: "Payment abc" }, "wrong_auth_scheme", /Payment/],
    ["two keys", { "x-api-key": GOOD_KEY, ...bearer() }, "wrong_auth_field", /not both/],
  ] as const)(
    "answers %s with 401 authentication_error in Anthropic's shape",
    async (_, headers, code, msg) => {
      const { app } = edge();
      const res = await app.inject(messages({}, { ...json, "anthropic-version": "2023-06-01", ...headers }));
      expect(res.statusCode).toBe(401);
      const body = anthropicError(res);
      expect(body.type).toBe("error");
      expect(body.error).toMatchObject({ type: "authentication_error", code });
      expect(body.error.message).toMatch(msg);
    },
  );

  it.each([
    ["no max_tokens", { max_tokens: undefined }, /max_tokens is required/],
    ["max_tokens 0", { max_tokens: 0 }, /^max_tokens: must be at least 1$/],
    ["max_tokens too large", { max_tokens: 1_000_001 }, /^max_tokens: must be at most \d+$/],
    ["max_tokens not whole", { max_tokens: 1.5 }, /^max_tokens: must be a whole number$/],
    ["tools", { tools: [{ name: "t", input_schema: {} }] }, /tools are not supported/],
    [
      "an image block",
      { messages: [{ role: "user", content: [{ type: "image", source: {} }] }] },
      /only text content blocks/,
    ],
    ["extended thinking", { thinking: { type: "enabled", budget_tokens: 1024 } }, /thinking/],
    ["a system role in messages", { messages: [{ role: "system", content: "x" }] }, /role/],
  ] as const)("refuses %s with 400 invalid_request_error, holding nothing", async (_, over, msg) => {
    const { app, f } = edge();
    const res = await app.inject(messages(over));
    expect(res.statusCode).toBe(400);
    const body = anthropicError(res);
    expect(body.error).toMatchObject({ type: "invalid_request_error", code: "invalid_request" });
    expect(body.error.message).toMatch(msg);
    expect(f.forwarded).toEqual([]);
  });

  it("answers the router's and auth-policy's refusals with their table status, in Anthropic's shape", async () => {
    const { app, f } = edge();
    f.inferenceFails = new RemoteError(GrpcStatus.DEADLINE_EXCEEDED, "upstream_timeout", "slow");
    const timeout = await app.inject(messages());
    expect(timeout.statusCode).toBe(504);
    expect(anthropicError(timeout).error.type).toBe("timeout_error");
    f.authFails = new RemoteError(GrpcStatus.RESOURCE_EXHAUSTED, "rate_limited", "slow down", {
      "retry-after": "3",
    });
    const limited = await app.inject(messages());
    expect(limited.statusCode).toBe(429);
    expect(limited.headers["retry-after"]).toBe("3");
    expect(anthropicError(limited).error).toMatchObject({ type: "rate_limit_error", code: "rate_limited" });
  });

  it("names the request id in Anthropic's request-id header too, on a message, a stream, a refusal and a 405", async () => {
    const { app } = edge();
    const answers = [
      await app.inject(messages()),
      await app.inject(messages({ stream: true })),
      await app.inject(messages({}, anthropic(BAD_KEY))),
      await app.inject({ ...messages(), payload: "{not json" }),
      await app.inject({ method: "GET", url: "/v1/messages" }),
    ];
    expect(answers.map((res) => res.statusCode)).toEqual([200, 200, 401, 400, 405]);
    for (const res of answers) {
      expect(res.headers["request-id"]).toMatch(/.+/);
      expect(res.headers["request-id"]).toBe(res.headers["x-request-id"]);
    }
  });

  it("answers another method with 405 in Anthropic's shape, with Allow", async () => {
    const { app } = edge();
    const res = await app.inject({ method: "GET", url: "/v1/messages", headers: anthropic() });
    expect(res.statusCode).toBe(405);
    expect(res.headers.allow).toBe("POST");
    expect(anthropicError(res).type).toBe("error");
    expect(anthropicError(res).error).toMatchObject({
      type: "invalid_request_error",
      code: "method_not_allowed",
    });
  });

  it("refuses a key in api-key, alone or beside x-api-key, with 401 wrong_auth_field", async () => {
    const { app, f } = edge();
    for (const headers of [
      { ...json, "api-key": GOOD_KEY },
      { ...anthropic(), "api-key": GOOD_KEY },
    ]) {
      const res = await app.inject(messages({}, headers));
      expect(res.statusCode).toBe(401);
      expect(anthropicError(res).error).toMatchObject({ code: "wrong_auth_field" });
    }
    expect(f.forwarded).toEqual([]);
  });

  it("answers a path below /v1/messages it does not serve (count_tokens) with 404 in Anthropic's shape", async () => {
    const { app } = edge();
    const res = await app.inject({
      method: "POST",
      url: "/v1/messages/count_tokens?beta=true",
      headers: anthropic(),
      payload: {},
    });
    expect(res.statusCode).toBe(404);
    expect(res.headers["request-id"]).toBe(res.headers["x-request-id"]);
    expect(anthropicError(res).error).toMatchObject({ type: "not_found_error", code: "not_found" });
    // Elsewhere a missing route keeps OpenAI's shape.
    const other = await app.inject({
      method: "POST",
      url: "/v1/moderations",
      headers: bearer(),
      payload: {},
    });
    expect(other.statusCode).toBe(404);
    expect(other.json()).toMatchObject({ error: { code: "not_found" } });
  });

  it("answers a body that is not JSON with 400 invalid_request_error", async () => {
    const { app } = edge();
    const res = await app.inject({ ...messages(), payload: "{not json" });
    expect(res.statusCode).toBe(400);
    expect(anthropicError(res).error).toMatchObject({ type: "invalid_request_error", code: "invalid_json" });
  });
});

describe("an Idempotency-Key request whose caller left while its key was checked", () => {
  it("claims nothing, takes no hold and counts no rate-limit unit", async () => {
    const { app, f } = edge();
    const { wait, open: authorized } = gate();
    f.authWaits = wait;
    await leaveWhileWaiting(
      app,
      ROUTES.chat.path,
      { ...json, ...bearer(), "idempotency-key": "left-while-checked" },
      BODIES.chat,
      authorized,
    );
    await new Promise((r) => setTimeout(r, 200));
    // The check only: no Authorize with a hold followed it, and nothing was released.
    expect(f.authorized).toHaveLength(1);
    expect(f.settled).toEqual([]);
    expect(f.routerCalls ?? 0).toBe(0);
  });
});

describe("duplicates of one Idempotency-Key waiting on a replica", () => {
  it(`lets ${MAX_WAITING_DUPLICATES} wait for the running request and answers any more 409 at once; the waiters get its answer`, async () => {
    const { app, f } = edge();
    const { wait, open: answer } = gate();
    f.completeWaits = wait;
    const send = () =>
      app.inject({
        method: "POST",
        url: ROUTES.chat.path,
        headers: { ...json, ...bearer(), "idempotency-key": "many-waiters" },
        payload: JSON.stringify(BODIES.chat),
      });
    const first = send();
    await new Promise((r) => setTimeout(r, 50));
    const waiters = Array.from({ length: MAX_WAITING_DUPLICATES }, send);
    await new Promise((r) => setTimeout(r, 150));
    const extra = await send();
    expect(extra.statusCode, extra.body).toBe(409);
    expect(code(extra)).toBe("idempotency_in_progress");
    answer();
    expect((await first).statusCode).toBe(200);
    for (const w of await Promise.all(waiters)) {
      expect(w.statusCode, w.body).toBe(200);
      expect(w.headers["idempotent-replayed"]).toBe("true");
    }
    // The model ran once for all of them.
    expect(f.completed).toHaveLength(1);
  });
});
