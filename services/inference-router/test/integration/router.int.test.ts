import { createServer as createTcpServer, type Socket, connect as tcpConnect } from "node:net";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { costOf, type GatewayConfig, parseGatewayConfig, pricingSnapshotId } from "@tollgate/config";
import { type Client, createClient, GrpcStatus, type MethodsOf, RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { connectNats, drainNats, type NatsConnection } from "@tollgate/kit/nats";
import {
  type CompletionInputSchema,
  Door,
  InferenceService,
  Operation,
  type StreamCompleteResponse,
} from "@tollgate/proto/inference";
import { natsNames } from "@tollgate/proto/subjects";
import { Outcome, Door as UsageDoor, type UsageRecorded, usageEventsOf } from "@tollgate/proto/usage";
import {
  expectedOutput,
  expectedUsage,
  type FakeUpstream,
  startFakeUpstream,
} from "@tollgate/testkit/fake-upstream";
import { type NatsFixture, uniqueNamespace, useNats } from "@tollgate/testkit/fixtures";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { type InferenceRouter, start } from "../../src/app.js";

type Service = MethodsOf<typeof InferenceService>;
type InputInit = MessageInitShape<typeof CompletionInputSchema>;

const log = createLogger({ service: "inference-router", level: "silent" });
const WAIT = { timeout: 10_000, interval: 100 };
const CALL = { timeoutMs: 15_000 };
const encoder = new TextEncoder();
const decoder = new TextDecoder();

const ns = uniqueNamespace("router");
const names = natsNames(ns);

let nats: NatsFixture;
let nc: NatsConnection;
let fake: FakeUpstream;
let tap: Tap;
let gateway: GatewayConfig;
let router: InferenceRouter;
let client: Client<Service>;
const routers = new Set<InferenceRouter>();
const clients = new Set<{ $close(): void }>();

/** What each served request must have produced on the usage stream, by request id. */
const served = new Map<string, Partial<UsageRecorded>>();

// ---------------------------------------------------------------------------------------------
// A TCP tap between the router and the fake upstream: it shows what the fake wrote on each
// connection and whether that connection was closed, which the fake itself does not expose.

interface Exchange {
  request: string;
  response: string;
}

interface TappedConnection {
  exchanges: Exchange[];
  closed: boolean;
}

interface Tap {
  url: string;
  connections: TappedConnection[];
  close(): Promise<void>;
}

async function startTap(targetPort: number): Promise<Tap> {
  const connections: TappedConnection[] = [];
  const sockets = new Set<Socket>();
  const server = createTcpServer((downstream) => {
    const conn: TappedConnection = { exchanges: [], closed: false };
    connections.push(conn);
    const upstream = tcpConnect(targetPort, "127.0.0.1");
    sockets.add(downstream).add(upstream);
    downstream.on("data", (data: Buffer) => {
      const text = data.toString("utf8");
      // undici sends one request at a time per connection: a request line starts an exchange.
      if (/^(POST|GET) /.test(text) || conn.exchanges.length === 0)
        conn.exchanges.push({ request: "", response: "" });
      conn.exchanges.at(-1)!.request += text;
      upstream.write(data);
    });
    upstream.on("data", (data: Buffer) => {
      const current = conn.exchanges.at(-1);
      if (current) current.response += data.toString("utf8");
      downstream.write(data);
    });
    const end = () => {
      conn.closed = true;
      downstream.destroy();
      upstream.destroy();
      sockets.delete(downstream);
      sockets.delete(upstream);
    };
    downstream.on("close", end).on("error", () => {});
    upstream.on("close", end).on("error", () => {});
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    connections,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** The connection and exchange that carried the request containing `marker`. */
function tapped(marker: string): { conn: TappedConnection; exchange: Exchange } | undefined {
  for (const conn of tap.connections) {
    const exchange = conn.exchanges.find((e) => e.request.includes(marker));
    if (exchange) return { conn, exchange };
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------

beforeAll(async () => {
  nats = await useNats();
  nc = await connectNats(nats.url, "inference-router-int-test");
  fake = await startFakeUpstream({ record: true });
  tap = await startTap(fake.port);
  gateway = parseGatewayConfig(
    {
      upstreams: [{ id: "fake-up", baseUrl: tap.url, timeoutMs: 10_000 }],
      models: [
        {
          id: "small",
          upstream: "fake-up",
          upstreamModel: "fake-small",
          runtime: "vllm",
          pricing: { inputPerMillion: 150_000, outputPerMillion: 600_000 },
        },
        {
          id: "thinker",
          upstream: "fake-up",
          upstreamModel: "fake-reasoner",
          runtime: "llama.cpp",
          pricing: { inputPerMillion: "3000000", outputPerMillion: "15000000" },
        },
      ],
    },
    "router.int.test",
  );
  router = await startRouter();
  client = clientOf(router);
  await client.$ready(5_000);
});

afterAll(async () => {
  for (const c of clients) c.$close();
  for (const r of routers) await r.stop();
  await fake?.close();
  await tap?.close();
  if (nc) {
    await jetstreamManager(nc)
      .then((jsm) => jsm.streams.delete(names.usageStream))
      .catch(() => undefined);
    await drainNats(nc);
  }
  await nats?.stop();
});

async function startRouter(): Promise<InferenceRouter> {
  const r = await start(
    { grpcHost: "127.0.0.1", grpcPort: 0, gateway, upstreamKeys: {}, natsUrl: nats.url, natsNamespace: ns },
    log,
  );
  routers.add(r);
  return r;
}

async function stopRouter(r: InferenceRouter): Promise<void> {
  routers.delete(r);
  await r.stop();
}

function clientOf(r: InferenceRouter): Client<Service> {
  const c = createClient(InferenceService, `127.0.0.1:${r.port}`);
  clients.add(c);
  return c;
}

const BILLING = {
  door: Door.PAID,
  accountId: "acct_int",
  connectionId: "conn_int",
  keyId: "key_int",
  reservationId: "hold_int",
  channelId: `0x${"ef".repeat(32)}`,
};

let seq = 0;

/** A request with a unique id and a unique prompt, so the fake's records and the tap can find it. */
function request(opts: {
  model?: string;
  cap?: number;
  operation?: Operation;
  body?: Record<string, unknown>;
  billing?: typeof BILLING;
}) {
  const requestId = `req_${ns}_${++seq}`;
  const marker = `marker-${requestId}`;
  const body = opts.body ?? {
    model: opts.model ?? "small",
    messages: [{ role: "user", content: `Tell me about ${marker}` }],
  };
  const bytes = encoder.encode(JSON.stringify(body));
  const input: InputInit = {
    requestId,
    operation: opts.operation ?? Operation.CHAT,
    model: opts.model ?? "small",
    body: bytes,
    billing: opts.billing ?? BILLING,
    ...(opts.cap !== undefined ? { maxOutputTokens: opts.cap } : {}),
  };
  return { requestId, marker, body, bodyBytes: bytes.byteLength, input };
}

/** The body the fake upstream received for the request carrying `marker`. */
function upstreamBody(marker: string): Record<string, unknown> {
  const found = fake.requests.filter((r) => JSON.stringify(r.body).includes(marker));
  expect(found).toHaveLength(1);
  return found[0]!.body as Record<string, unknown>;
}

function priced(model: "small" | "thinker", inputTokens: number, outputTokens: number): string {
  const prices = gateway.models.find((m) => m.id === model)!.pricing;
  return costOf({ inputTokens, outputTokens }, prices).toString();
}

/** Every UsageRecorded in this namespace's stream, read with an ordered consumer. */
async function readUsage(): Promise<UsageRecorded[]> {
  const jsm = await jetstreamManager(nc);
  const total = (await jsm.streams.info(names.usageStream)).state.messages;
  if (total === 0) return [];
  const consumer = await jetstream(nc).consumers.get(names.usageStream);
  const messages = await consumer.fetch({ max_messages: total, expires: 5_000 });
  const out: UsageRecorded[] = [];
  let read = 0;
  for await (const m of messages) {
    out.push(...usageEventsOf(m.subject, m.data));
    if (++read >= total) break;
  }
  expect(read).toBe(total);
  return out;
}

/** Waits for the usage event of `requestId`, then checks it stays the only one. */
async function onlyEventOf(requestId: string, settleMs = 0): Promise<UsageRecorded> {
  await vi.waitFor(async () => {
    expect((await readUsage()).some((e) => e.requestId === requestId)).toBe(true);
  }, WAIT);
  if (settleMs > 0) await new Promise((r) => setTimeout(r, settleMs));
  const events = (await readUsage()).filter((e) => e.requestId === requestId);
  expect(events).toHaveLength(1);
  return events[0]!;
}

async function readStream(
  events: AsyncIterable<StreamCompleteResponse>,
): Promise<{ chunks: Record<string, unknown>[]; messages: StreamCompleteResponse[] }> {
  const messages: StreamCompleteResponse[] = [];
  for await (const m of events) messages.push(m);
  const chunks = messages.flatMap((m) =>
    m.event.case === "chunk" ? [JSON.parse(decoder.decode(m.event.value)) as Record<string, unknown>] : [],
  );
  return { chunks, messages };
}

const contentOf = (chunks: Record<string, unknown>[], field = "content") =>
  chunks
    .map((c) => {
      const choice = (c.choices as Array<{ delta?: Record<string, string> }>)[0];
      return choice?.delta?.[field] ?? "";
    })
    .join("");

async function remoteError(p: Promise<unknown>): Promise<RemoteError> {
  const err = await p.then(
    () => expect.unreachable("expected the call to fail"),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RemoteError);
  return err as RemoteError;
}

describe("inference-router over gRPC, with real NATS", () => {
  it("serves a buffered completion with the public model id and records its usage once", async () => {
    const req = request({ cap: 7 });
    const res = await client.complete({ input: req.input }, CALL);

    // The fake upstream got its own model id and the authorized cap.
    const sent = upstreamBody(req.marker);
    expect(sent.model).toBe("fake-small");
    expect(sent.max_tokens).toBe(7);
    expect(sent).not.toHaveProperty("stream");
    expect(fake.requests.find((r) => r.body === sent)!.path).toBe("/v1/chat/completions");

    const expected = expectedOutput(sent);
    const json = JSON.parse(decoder.decode(res.body)) as {
      model: string;
      choices: Array<{ message: { content: string } }>;
      usage: { prompt_tokens: number; completion_tokens: number };
    };
    expect(json.model).toBe("small");
    expect(json.choices[0]!.message.content).toBe(expected.texts[0]);
    expect(json.usage.completion_tokens).toBe(7);

    const inputTokens = expected.usage.prompt_tokens;
    const cost = priced("small", inputTokens, 7);
    expect(res.usage).toMatchObject({
      inputTokens,
      outputTokens: 7,
      reasoningTokens: 0,
      cost,
      pricingSnapshotId: pricingSnapshotId(gateway.models),
    });

    const event = await onlyEventOf(req.requestId);
    const expectedEvent: Partial<UsageRecorded> = {
      requestId: req.requestId,
      door: UsageDoor.PAID,
      accountId: "acct_int",
      connectionId: "conn_int",
      keyId: "key_int",
      reservationId: "hold_int",
      channelId: `0x${"ef".repeat(32)}`,
      model: "small",
      runtime: "vllm",
      upstreamId: "fake-up",
      inputTokens,
      outputTokens: 7,
      reasoningTokens: 0,
      cost,
      pricingSnapshotId: pricingSnapshotId(gateway.models),
      outcome: Outcome.COMPLETED,
      streamed: false,
    };
    expect(event).toMatchObject(expectedEvent);
    expect(event.eventId).not.toBe("");
    expect(Math.abs(Number(event.occurredAt!.seconds) * 1000 - Date.now())).toBeLessThan(60_000);
    served.set(req.requestId, expectedEvent);
  });

  it("sends a text completion to /completions", async () => {
    const req = request({
      operation: Operation.TEXT,
      cap: 2,
      body: { model: "small", prompt: "Once upon a time" },
    });
    const res = await client.complete({ input: req.input }, CALL);
    const sent = fake.requests.at(-1)!;
    expect(sent.path).toBe("/v1/completions");
    expect(sent.body).toMatchObject({ model: "fake-small", max_tokens: 2 });
    expect(res.usage?.outputTokens).toBe(2);
    served.set(req.requestId, { outcome: Outcome.COMPLETED, outputTokens: 2 });
  });

  it("streams chunks then a final usage message, hiding the usage chunk the caller did not ask for", async () => {
    const req = request({
      model: "thinker",
      cap: 6,
      billing: { ...BILLING, door: Door.ACCOUNT, reservationId: "rsv_account", channelId: "" },
    });
    const { chunks, messages } = await readStream(
      client.streamComplete({ input: req.input, includeUsage: false }, CALL),
    );

    const sent = upstreamBody(req.marker);
    expect(sent).toMatchObject({
      model: "fake-reasoner",
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    const expected = expectedOutput(sent);

    // role, 4 reasoning words, the 2 words the cap leaves for the answer, finish: never the
    // usage-only chunk.
    expect(chunks).toHaveLength(8);
    expect(chunks.every((c) => c.model === "thinker")).toBe(true);
    expect(chunks.some((c) => Array.isArray(c.choices) && c.choices.length === 0)).toBe(false);
    expect(contentOf(chunks)).toBe(expected.texts[0]);
    expect(contentOf(chunks, "reasoning_content")).toBe(expected.reasoning);

    const last = messages.at(-1)!;
    expect(messages.filter((m) => m.event.case === "usage")).toHaveLength(1);
    expect(last.event.case).toBe("usage");
    const inputTokens = expected.usage.prompt_tokens;
    const cost = priced("thinker", inputTokens, 6);
    expect(last.event.value).toMatchObject({ inputTokens, outputTokens: 6, reasoningTokens: 4, cost });

    const expectedEvent: Partial<UsageRecorded> = {
      requestId: req.requestId,
      door: UsageDoor.ACCOUNT,
      accountId: "acct_int",
      connectionId: "conn_int",
      keyId: "key_int",
      reservationId: "rsv_account",
      model: "thinker",
      runtime: "llama.cpp",
      upstreamId: "fake-up",
      inputTokens,
      outputTokens: 6,
      reasoningTokens: 4,
      cost,
      outcome: Outcome.COMPLETED,
      streamed: true,
    };
    expect(await onlyEventOf(req.requestId)).toMatchObject(expectedEvent);
    served.set(req.requestId, expectedEvent);
  });

  it("passes the usage chunk on when the caller asked for it", async () => {
    const req = request({ cap: 3 });
    const { chunks, messages } = await readStream(
      client.streamComplete({ input: req.input, includeUsage: true }, CALL),
    );
    const usageChunk = chunks.at(-1)!;
    expect(usageChunk).toMatchObject({ model: "small", choices: [], usage: { completion_tokens: 3 } });
    expect(messages.at(-1)!.event.case).toBe("usage");
    expect(await onlyEventOf(req.requestId)).toMatchObject({ outcome: Outcome.COMPLETED, outputTokens: 3 });
    served.set(req.requestId, { outcome: Outcome.COMPLETED, outputTokens: 3 });
  });

  it("bills what was produced when the caller cancels mid-stream, and closes the upstream connection", async () => {
    fake.configure({ tokensPerSecond: 50, outputTokens: 200 });
    try {
      const req = request({ cap: 40 });
      const abort = new AbortController();
      const received: Record<string, unknown>[] = [];
      let textChunks = 0;
      const stream = client.streamComplete(
        { input: req.input, includeUsage: true },
        { ...CALL, signal: abort.signal },
      );
      const ended = await (async () => {
        for await (const m of stream) {
          if (m.event.case !== "chunk") continue;
          const chunk = JSON.parse(decoder.decode(m.event.value)) as Record<string, unknown>;
          received.push(chunk);
          if (contentOf([chunk]) !== "") textChunks++;
          if (textChunks === 3) abort.abort();
        }
      })().then(
        () => undefined,
        (e: unknown) => e,
      );
      if (ended !== undefined) {
        expect(ended).toBeInstanceOf(RemoteError);
        expect((ended as RemoteError).status).toBe(GrpcStatus.CANCELLED);
      }
      expect(textChunks).toBe(3);

      const event = await onlyEventOf(req.requestId, 500);
      expect(event.outcome).toBe(Outcome.CLIENT_CANCELLED);
      expect(event.streamed).toBe(true);
      expect(event.outputTokens).toBeGreaterThanOrEqual(3);
      expect(event.outputTokens).toBeLessThanOrEqual(39);
      // A vLLM upstream counts continuously when asked: the input is its own count, exactly.
      expect(event.inputTokens).toBe(expectedUsage({ ...req.body, model: "fake-small" }).prompt_tokens);
      expect(event.inputTokens).not.toBe(Math.ceil(req.bodyBytes / 4));
      expect(event.cost).toBe(priced("small", event.inputTokens, event.outputTokens));
      served.set(req.requestId, { outcome: Outcome.CLIENT_CANCELLED });

      // The router hung up on the upstream, which therefore stopped writing well before the
      // 40 tokens it would otherwise have sent.
      await vi.waitFor(() => expect(tapped(req.marker)?.conn.closed).toBe(true), { timeout: 2_000 });
      const { exchange } = tapped(req.marker)!;
      const written = exchange.response.split('"delta":{"content":').length - 1;
      expect(written).toBeGreaterThanOrEqual(3);
      expect(written).toBeLessThan(40);
      expect(exchange.response).not.toContain("[DONE]");
    } finally {
      fake.configure({ tokensPerSecond: 0, outputTokens: 12 });
    }
  });

  it("records upstream_failed with what was produced when the upstream cuts the stream", async () => {
    fake.failNext(1, { afterChunks: 3 });
    const req = request({ cap: 10 });
    const received: StreamCompleteResponse[] = [];
    const err = await remoteError(
      (async () => {
        for await (const m of client.streamComplete({ input: req.input, includeUsage: false }, CALL))
          received.push(m);
      })(),
    );
    expect(err.code).toBe("upstream_error");
    expect(err.status).toBe(GrpcStatus.UNAVAILABLE);
    expect(received.every((m) => m.event.case === "chunk")).toBe(true);

    const event = await onlyEventOf(req.requestId);
    expect(event).toMatchObject({ outcome: Outcome.UPSTREAM_FAILED, outputTokens: 3, streamed: true });
    served.set(req.requestId, { outcome: Outcome.UPSTREAM_FAILED, outputTokens: 3 });
  });

  it("refuses an unknown model with model_not_found and records nothing", async () => {
    const buffered = await remoteError(client.complete({ input: request({ model: "ghost" }).input }, CALL));
    expect(buffered.code).toBe("model_not_found");
    expect(buffered.status).toBe(GrpcStatus.NOT_FOUND);

    const streamed = await remoteError(
      readStream(
        client.streamComplete({ input: request({ model: "ghost" }).input, includeUsage: true }, CALL),
      ),
    );
    expect(streamed.code).toBe("model_not_found");
  });

  it("passes an upstream refusal on as upstream_rejected and records nothing", async () => {
    const err = await remoteError(
      client.complete({ input: request({ body: { model: "small", messages: "not a list" } }).input }, CALL),
    );
    expect(err.code).toBe("upstream_rejected");
    expect(err.status).toBe(GrpcStatus.INVALID_ARGUMENT);
    expect(err.message).toBe("messages is required");
  });

  it("lets an in-flight stream finish, usage included, when the router is stopped", async () => {
    const second = await startRouter();
    const secondClient = clientOf(second);
    fake.configure({ tokensPerSecond: 20 });
    try {
      const req = request({ cap: 10 });
      const messages: StreamCompleteResponse[] = [];
      let stopping: Promise<void> | undefined;
      for await (const m of secondClient.streamComplete({ input: req.input, includeUsage: false }, CALL)) {
        messages.push(m);
        stopping ??= stopRouter(second);
      }
      expect(stopping).toBeDefined();
      await stopping;

      // role, 10 words, finish, then the usage
      expect(messages.filter((m) => m.event.case === "chunk")).toHaveLength(12);
      const last = messages.at(-1)!;
      expect(last.event.case).toBe("usage");
      expect(last.event.value).toMatchObject({ outputTokens: 10 });
      expect(await onlyEventOf(req.requestId)).toMatchObject({
        outcome: Outcome.COMPLETED,
        outputTokens: 10,
      });
      served.set(req.requestId, { outcome: Outcome.COMPLETED, outputTokens: 10 });

      // A stopped router takes no new calls.
      const refused = await remoteError(
        secondClient.complete({ input: request({}).input }, { timeoutMs: 5_000 }),
      );
      expect(refused.status).toBe(GrpcStatus.UNAVAILABLE);
    } finally {
      fake.configure({ tokensPerSecond: 0 });
    }
  });

  it("left exactly one usage event per served request on the stream, each with its own id", async () => {
    expect(served.size).toBe(7);
    const events = await readUsage();
    expect(events.map((e) => e.requestId).sort()).toEqual([...served.keys()].sort());
    expect(new Set(events.map((e) => e.eventId)).size).toBe(events.length);
    for (const e of events) expect(e).toMatchObject(served.get(e.requestId)!);
  });
});
