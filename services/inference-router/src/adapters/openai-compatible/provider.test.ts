import {
  expectedOutput,
  expectedUsage,
  type FakeUpstream,
  startFakeUpstream,
} from "@tollgate/testkit/fake-upstream";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { InferenceError } from "../../domain/errors.js";
import type { ProviderChunk, ProviderRequest } from "../../domain/ports.js";
import { createOpenAICompatibleProvider, normaliseUsage } from "./provider.js";

let fake: FakeUpstream;
const providers: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  fake = await startFakeUpstream();
});

afterEach(() => {
  fake.configure({ tokensPerSecond: 0, ttftMs: 0 });
});

afterAll(async () => {
  await Promise.all(providers.map((p) => p.close()));
  await fake.close();
});

function provider(opts: { apiKey?: string; timeoutMs?: number; url?: string } = {}) {
  const p = createOpenAICompatibleProvider({
    id: "fake",
    baseUrl: opts.url ?? fake.url,
    timeoutMs: opts.timeoutMs ?? 5_000,
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

async function drain(chunks: AsyncIterable<ProviderChunk>): Promise<ProviderChunk[]> {
  const out: ProviderChunk[] = [];
  for await (const c of chunks) out.push(c);
  return out;
}

async function failure(p: Promise<unknown>): Promise<InferenceError> {
  const err = await p.then(
    () => expect.unreachable("expected a rejection"),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(InferenceError);
  return err as InferenceError;
}

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
    expect(result.usage?.outputTokens).toBe(5 + 4);
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
    const err = await failure(provider({ timeoutMs: 300 }).complete(chat(), signal()));
    expect(err.code).toBe("upstream_timeout");
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
      guarded = await startFakeUpstream({ apiKey: "sk-upstream-123" });
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

describe("normaliseUsage", () => {
  it("maps OpenAI usage and ignores what is missing or malformed", () => {
    expect(
      normaliseUsage({
        prompt_tokens: 3,
        completion_tokens: 4,
        completion_tokens_details: { reasoning_tokens: 2 },
      }),
    ).toEqual({ inputTokens: 3, outputTokens: 4, reasoningTokens: 2 });
    expect(normaliseUsage({ prompt_tokens: -1, completion_tokens: 1.5 })).toEqual({
      inputTokens: 0,
      outputTokens: 0,
      reasoningTokens: 0,
    });
    expect(normaliseUsage(null)).toBeUndefined();
    expect(normaliseUsage(undefined)).toBeUndefined();
  });
});
