import {
  expectedOutput,
  expectedUsage,
  type FakeUpstream,
  startFakeUpstream,
} from "@tollgate/testkit/fake-upstream";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { InferenceError } from "../../domain/errors.js";
import type { ProviderChunk, ProviderRequest } from "../../domain/ports.js";
import { drain, failure } from "../upstream-http/testing.js";
import {
  createOpenAICompatibleProvider,
  normaliseUsage,
  PROBE_PROMPT,
  parseRetryAfter,
  type UpstreamTimeouts,
} from "./provider.js";

let fake: FakeUpstream;
const providers: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  fake = await startFakeUpstream({ record: true });
});

afterEach(() => {
  fake.configure({ tokensPerSecond: 0, ttftMs: 0, firstByteDelayMs: 0 });
});

afterAll(async () => {
  await Promise.all(providers.map((p) => p.close()));
  await fake.close();
});

const TIMEOUTS: UpstreamTimeouts = { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000, totalMs: 5_000 };

function provider(opts: { apiKey?: string; timeouts?: Partial<UpstreamTimeouts>; url?: string } = {}) {
  const p = createOpenAICompatibleProvider({
    id: "fake",
    baseUrl: opts.url ?? fake.url,
    timeouts: { ...TIMEOUTS, ...opts.timeouts },
    ...(opts.apiKey !== undefined ? { apiKey: opts.apiKey } : {}),
  });
  providers.push(p);
  return p;
}

const chatBody = (extra: Record<string, unknown> = {}) => ({
  model: "fake-small",
  messages: [{ role: "user", content: "Tell me a story" }],
  max_tokens: 5,
  ...extra,
});

const chat = (extra: Record<string, unknown> = {}): ProviderRequest => ({
  operation: "chat",
  body: chatBody(extra),
});

const streamChat = (extra: Record<string, unknown> = {}): ProviderRequest =>
  chat({ stream: true, stream_options: { include_usage: true }, ...extra });

const lastRequest = () => fake.requests.at(-1)!;
const signal = () => new AbortController().signal;

describe("OpenAI-compatible provider", () => {
  it("runs a buffered chat completion and normalises its usage", async () => {
    const result = await provider().complete(chat(), signal());

    const expected = expectedOutput(chatBody());
    const choices = result.json.choices as Array<{ message: { content: string } }>;
    expect(choices[0]!.message.content).toBe(expected.texts[0]);
    expect(result.usage).toEqual({
      inputTokens: expected.usage.prompt_tokens,
      outputTokens: 5,
      reasoningTokens: 0,
    });
    expect(lastRequest().path).toBe("/v1/chat/completions");
    expect(lastRequest().body).toEqual(chatBody());
  });

  it("runs a text completion on /completions", async () => {
    const body = { model: "fake-small", prompt: "Once upon a time", max_tokens: 3 };
    const result = await provider().complete({ operation: "text", body }, signal());
    expect(lastRequest().path).toBe("/v1/completions");
    expect(result.usage).toEqual({
      inputTokens: expectedUsage(body, { route: "completions" }).prompt_tokens,
      outputTokens: 3,
      reasoningTokens: 0,
    });
  });

  it("reports reasoning tokens from completion_tokens_details", async () => {
    const result = await provider().complete(chat({ model: "fake-reasoner" }), signal());
    expect(result.usage?.reasoningTokens).toBe(4);
    // The cap of 5 bounds reasoning and answer together: 4 of reasoning, 1 of answer.
    expect(result.usage?.outputTokens).toBe(5);
  });

  it("streams every chunk, the last one carrying usage", async () => {
    const chunks = await drain(provider().stream(streamChat(), signal()));

    const expected = expectedOutput(streamChat().body);
    const text = chunks
      .map((c) => (c.json.choices as Array<{ delta?: { content?: string } }>)[0]?.delta?.content ?? "")
      .join("");
    expect(text).toBe(expected.texts[0]);
    // role chunk, five words, finish chunk, usage chunk
    expect(chunks).toHaveLength(8);
    expect(chunks.slice(0, -1).every((c) => c.usage === undefined)).toBe(true);
    expect(chunks.at(-1)!.usage).toEqual({
      inputTokens: expected.usage.prompt_tokens,
      outputTokens: 5,
      reasoningTokens: 0,
    });
    expect(lastRequest().headers.accept).toBe("text/event-stream");
  });

  it("passes the upstream's message on when it rejects the request (400 → upstream_rejected)", async () => {
    const err = await failure(provider().complete(chat({ max_tokens: -1 }), signal()));
    expect(err.code).toBe("upstream_rejected");
    expect(err.message).toBe("max_tokens must be a non-negative integer");
  });

  it("rejects a stream the upstream refuses with upstream_rejected", async () => {
    const err = await failure(drain(provider().stream(streamChat({ max_tokens: -1 }), signal())));
    expect(err.code).toBe("upstream_rejected");
    expect(err.message).toBe("max_tokens must be a non-negative integer");
  });

  it("never passes on the gateway's upstream API key when the upstream echoes it in a rejection", async () => {
    const key = "sk-upstream-0123456789abcdef";
    for (const stream of [false, true]) {
      fake.failNext(1, {
        status: 400,
        body: JSON.stringify({ error: { message: `bad request (sent with Authorization: Bearer ${key})` } }),
      });
      const p = provider({ apiKey: key });
      const err = await failure(
        stream ? drain(p.stream(streamChat(), signal())) : p.complete(chat(), signal()),
      );
      expect(err.code).toBe("upstream_rejected");
      expect(err.message).not.toContain(key);
      expect(err.message).toBe("bad request (sent with Authorization: [redacted])");
    }
  });

  it("does not pass on a 4xx body that is not JSON", async () => {
    fake.failNext(1, { status: 422, body: "secret internal detail" });
    const err = await failure(provider().complete(chat(), signal()));
    expect(err.code).toBe("upstream_rejected");
    expect(err.message).not.toContain("secret");
  });

  it.each([500, 503, 429, 401, 403, 408])("maps status %i to upstream_error", async (status) => {
    fake.failNext(1, { status });
    const err = await failure(provider().complete(chat(), signal()));
    expect(err.code).toBe("upstream_error");
    expect(err.message).not.toContain("injected");
  });

  it("maps a failed stream request to upstream_error", async () => {
    fake.failNext(1, { status: 502 });
    const err = await failure(drain(provider().stream(streamChat(), signal())));
    expect(err.code).toBe("upstream_error");
  });

  it("fails a stream the upstream cuts mid-way with upstream_error, after the chunks it sent", async () => {
    fake.failNext(1, { afterChunks: 2 });
    const received: ProviderChunk[] = [];
    const err = await failure(
      (async () => {
        for await (const c of provider().stream(streamChat(), signal())) received.push(c);
      })(),
    );
    expect(err.code).toBe("upstream_error");
    // role chunk plus the two token chunks sent before the cut
    expect(received).toHaveLength(3);
  });

  it("fails a buffered request whose connection dies with upstream_error", async () => {
    fake.failNext(1, { afterChunks: 0 });
    const err = await failure(provider().complete(chat(), signal()));
    expect(err.code).toBe("upstream_error");
  });

  it("fails with upstream_error when the upstream cannot be reached", async () => {
    const closed = await startFakeUpstream();
    const url = closed.url;
    await closed.close();
    const err = await failure(provider({ url }).complete(chat(), signal()));
    expect(err.code).toBe("upstream_error");
  });

  it("fails with upstream_timeout when the upstream does not answer in time", async () => {
    fake.failNext(1, { hang: true });
    const err = await failure(provider({ timeouts: { firstTokenMs: 300 } }).complete(chat(), signal()));
    expect(err.code).toBe("upstream_timeout");
    expect(err.upstream).toEqual({ kind: "timeout" });
  });

  describe("names how an attempt failed, for failover and metrics", () => {
    it("a first byte later than firstTokenMs is a timeout, buffered or streamed", async () => {
      fake.configure({ firstByteDelayMs: 1_000 });
      const fast = provider({ timeouts: { firstTokenMs: 200 } });
      const started = performance.now();
      expect((await failure(fast.complete(chat(), signal()))).upstream).toEqual({ kind: "timeout" });
      expect((await failure(drain(fast.stream(streamChat(), signal())))).upstream).toEqual({
        kind: "timeout",
      });
      expect(performance.now() - started).toBeLessThan(1_500);
    });

    it("a stream whose headers came but whose first chunk did not is a timeout", async () => {
      fake.configure({ ttftMs: 1_000 });
      const err = await failure(
        drain(provider({ timeouts: { firstTokenMs: 200 } }).stream(streamChat(), signal())),
      );
      expect(err.code).toBe("upstream_timeout");
      expect(err.upstream).toEqual({ kind: "timeout" });
    });

    it("a stream that stalls after its first chunk is an idle timeout, after the chunks it sent", async () => {
      // Two tokens a second: 500 ms between chunks, above the 200 ms idle timeout.
      fake.configure({ tokensPerSecond: 2 });
      const received: ProviderChunk[] = [];
      const err = await failure(
        (async () => {
          for await (const c of provider({ timeouts: { idleMs: 200 } }).stream(streamChat(), signal()))
            received.push(c);
        })(),
      );
      expect(err.upstream).toEqual({ kind: "idle_timeout" });
      expect(received.length).toBeGreaterThan(0);
    });

    it("a stream longer than totalMs, or than the request's time left, is a total timeout", async () => {
      fake.configure({ tokensPerSecond: 10 });
      const long = streamChat({ max_tokens: 40 });
      const err = await failure(drain(provider({ timeouts: { totalMs: 300 } }).stream(long, signal())));
      expect(err.upstream).toEqual({ kind: "total_timeout" });
      const started = performance.now();
      const capped = await failure(drain(provider().stream({ ...long, timeLeftMs: 300 }, signal())));
      expect(capped.upstream).toEqual({ kind: "total_timeout" });
      expect(performance.now() - started).toBeLessThan(2_000);
    });

    it("statuses carry their kind, and 429 and 503 their Retry-After", async () => {
      fake.failNext(1, { status: 429, retryAfter: "2" });
      expect((await failure(provider().complete(chat(), signal()))).upstream).toEqual({
        kind: "status_429",
        retryAfterMs: 2_000,
      });
      fake.failNext(1, { status: 503, retryAfter: new Date(Date.now() + 60_000).toUTCString() });
      const unavailable = (await failure(provider().complete(chat(), signal()))).upstream;
      expect(unavailable?.kind).toBe("status_5xx");
      expect(unavailable?.retryAfterMs).toBeGreaterThan(55_000);
      fake.failNext(1, { status: 500, retryAfter: "5" });
      expect((await failure(provider().complete(chat(), signal()))).upstream).toEqual({ kind: "status_5xx" });
      fake.failNext(1, { status: 400 });
      expect((await failure(provider().complete(chat(), signal()))).upstream).toEqual({ kind: "status_4xx" });
      fake.failNext(1, { status: 401 });
      expect((await failure(provider().complete(chat(), signal()))).upstream).toEqual({
        kind: "status_auth",
      });
      fake.failNext(1, { status: 408 });
      expect((await failure(provider().complete(chat(), signal()))).upstream).toEqual({ kind: "timeout" });
    });

    it("no connection at all is a connect error; a connection that breaks after the request went out is interrupted", async () => {
      const closed = await startFakeUpstream();
      const url = closed.url;
      await closed.close();
      expect((await failure(provider({ url }).complete(chat(), signal()))).upstream).toEqual({
        kind: "connect_error",
      });
      fake.failNext(1, { afterChunks: 2 });
      expect((await failure(drain(provider().stream(streamChat(), signal())))).upstream).toEqual({
        kind: "interrupted",
      });
      // Closed before any answer, but after the request arrived: the request may be what did it.
      fake.failNext(1, { afterChunks: 0 });
      expect((await failure(provider().complete(chat(), signal()))).upstream).toEqual({
        kind: "interrupted",
      });
    });
  });

  describe("probe", () => {
    it("asks for one token of a fixed prompt, on the route and with the model id it is given", async () => {
      const p = provider({ apiKey: "sk-probe" });
      expect(await p.probe({ operation: "chat", model: "fake-small" })).toBeUndefined();
      expect(lastRequest()).toMatchObject({
        path: "/v1/chat/completions",
        body: { model: "fake-small", messages: [{ role: "user", content: PROBE_PROMPT }], max_tokens: 1 },
      });
      expect(lastRequest().headers.authorization).toBe("Bearer sk-probe");
      expect(await p.probe({ operation: "text", model: "fake-large" })).toBeUndefined();
      expect(lastRequest()).toMatchObject({
        path: "/v1/completions",
        body: { model: "fake-large", prompt: PROBE_PROMPT, max_tokens: 1 },
      });
    });

    it("says how it failed, as an attempt would", async () => {
      const target = { operation: "chat", model: "fake-small" } as const;
      fake.failNext(1, { status: 500 });
      expect(await provider().probe(target)).toBe("status_5xx");
      fake.failNext(1, { status: 401 });
      expect(await provider().probe(target)).toBe("status_auth");
      expect(await provider().probe({ ...target, model: "no-such-model" })).toBe("status_4xx");
      fake.failNext(1, { afterChunks: 0 });
      expect(await provider().probe(target)).toBe("interrupted");
      const closed = await startFakeUpstream();
      const url = closed.url;
      await closed.close();
      expect(await provider({ url }).probe(target)).toBe("connect_error");
    });

    it("gives up after the first-token timeout", async () => {
      fake.failNext(1, { hang: true });
      const started = Date.now();
      expect(
        await provider({ timeouts: { firstTokenMs: 300, totalMs: 60_000 } }).probe({
          operation: "chat",
          model: "fake-small",
        }),
      ).toBe("timeout");
      expect(Date.now() - started).toBeLessThan(2_000);
    });
  });

  it("stops reading and does not invent an error when the caller aborts", async () => {
    fake.configure({ tokensPerSecond: 20 });
    const abort = new AbortController();
    const received: ProviderChunk[] = [];
    const err = await (async () => {
      for await (const c of provider().stream(streamChat({ max_tokens: 10 }), abort.signal)) {
        received.push(c);
        if (received.length === 2) abort.abort();
      }
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    // The abort error itself comes back (or nothing), never an upstream failure to bill as one.
    expect(err).not.toBeInstanceOf(InferenceError);
    expect(received.length).toBeLessThan(5);
  });

  describe("with an upstream API key", () => {
    let guarded: FakeUpstream;
    beforeAll(async () => {
      guarded = await startFakeUpstream({ apiKey: "sk-upstream-123", record: true });
    });
    afterAll(async () => {
      await guarded.close();
    });

    it("sends the key as a Bearer token", async () => {
      const result = await provider({ url: guarded.url, apiKey: "sk-upstream-123" }).complete(
        chat(),
        signal(),
      );
      expect(result.usage?.outputTokens).toBe(5);
      expect(guarded.requests.at(-1)!.headers.authorization).toBe("Bearer sk-upstream-123");
      const chunks = await drain(
        provider({ url: guarded.url, apiKey: "sk-upstream-123" }).stream(streamChat(), signal()),
      );
      expect(chunks.at(-1)!.usage?.outputTokens).toBe(5);
    });

    it("treats a refused key as the gateway's failure (upstream_error), not the caller's", async () => {
      const err = await failure(
        provider({ url: guarded.url, apiKey: "sk-wrong" }).complete(chat(), signal()),
      );
      expect(err.code).toBe("upstream_error");
      expect(err.message).not.toContain("API key");
      const missing = await failure(provider({ url: guarded.url }).complete(chat(), signal()));
      expect(missing.code).toBe("upstream_error");
      expect(guarded.requests.at(-1)!.headers.authorization).toBeUndefined();
    });
  });
});

describe("parseRetryAfter", () => {
  it("reads seconds and HTTP dates, and ignores what it cannot read", () => {
    const now = Date.parse("2026-01-01T00:00:00Z");
    expect(parseRetryAfter("3", now)).toBe(3_000);
    expect(parseRetryAfter(["7"], now)).toBe(7_000);
    expect(parseRetryAfter("Thu, 01 Jan 2026 00:00:10 GMT", now)).toBe(10_000);
    expect(parseRetryAfter("Wed, 31 Dec 2025 23:59:00 GMT", now)).toBe(0);
    expect(parseRetryAfter("soon", now)).toBeUndefined();
    expect(parseRetryAfter("-1", now)).toBeUndefined();
    expect(parseRetryAfter(undefined, now)).toBeUndefined();
  });
});

describe("normaliseUsage", () => {
  it("maps OpenAI usage; an embedding has no output, and an invalid reasoning count (never priced) is 0", () => {
    expect(
      normaliseUsage(
        { prompt_tokens: 3, completion_tokens: 4, completion_tokens_details: { reasoning_tokens: 2 } },
        "chat",
      ),
    ).toEqual({ inputTokens: 3, outputTokens: 4, reasoningTokens: 2 });
    expect(normaliseUsage({ prompt_tokens: 0, completion_tokens: 0 }, "text")).toEqual({
      inputTokens: 0,
      outputTokens: 0,
      reasoningTokens: 0,
    });
    expect(normaliseUsage({ prompt_tokens: 7, total_tokens: 7 }, "embeddings")).toEqual({
      inputTokens: 7,
      outputTokens: 0,
      reasoningTokens: 0,
    });
    expect(
      normaliseUsage(
        { prompt_tokens: 3, completion_tokens: 4, completion_tokens_details: { reasoning_tokens: -2 } },
        "chat",
      ),
    ).toEqual({ inputTokens: 3, outputTokens: 4, reasoningTokens: 0 });
    expect(normaliseUsage(null, "chat")).toBeUndefined();
    expect(normaliseUsage(undefined, "chat")).toBeUndefined();
  });

  it("reads counts that are not counts as no usage, so the request is estimated rather than served free", () => {
    const notCounts = [-1000, -1, 1.5, "10", Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53, null, true];
    for (const bad of notCounts) {
      expect(normaliseUsage({ prompt_tokens: bad, completion_tokens: 5 }, "chat")).toBeUndefined();
      expect(normaliseUsage({ prompt_tokens: 5, completion_tokens: bad }, "text")).toBeUndefined();
      expect(normaliseUsage({ prompt_tokens: bad }, "embeddings")).toBeUndefined();
    }
    expect(normaliseUsage({ prompt_tokens: -1000, completion_tokens: -5 }, "chat")).toBeUndefined();
    // A chat or text completion always produces output: a usage without its count is no count.
    expect(normaliseUsage({ prompt_tokens: 12 }, "chat")).toBeUndefined();
    expect(normaliseUsage({ prompt_tokens: 12, completion_tokens: null }, "text")).toBeUndefined();
    // An embedding's given-but-invalid output count is no count either.
    expect(normaliseUsage({ prompt_tokens: 7, completion_tokens: -1 }, "embeddings")).toBeUndefined();
    expect(normaliseUsage({}, "embeddings")).toBeUndefined();
  });
});
