import { expectedOutput, type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { InferenceError } from "../../domain/errors.js";
import type { ProviderChunk, ProviderRequest } from "../../domain/ports.js";
import type { UpstreamTimeouts } from "../upstream-http/http-provider.js";
import { drain, failure } from "../upstream-http/testing.js";
import { ANTHROPIC_VERSION, createAnthropicProvider } from "./provider.js";
import { messagesBody } from "./request.js";
import { completionOf, streamDecoder } from "./response.js";

const KEY = "sk-ant-test-key";
let fake: FakeUpstream;
const providers: Array<{ close(): Promise<void> }> = [];

beforeAll(async () => {
  fake = await startFakeUpstream({ record: true, apiKey: KEY });
});

afterEach(() => {
  fake.configure({ tokensPerSecond: 0, firstByteDelayMs: 0 });
});

afterAll(async () => {
  await Promise.all(providers.map((p) => p.close()));
  await fake.close();
});

const TIMEOUTS: UpstreamTimeouts = { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000, totalMs: 5_000 };

/** An Anthropic provider on the fake; its base URL as Anthropic's is, without /v1. */
function provider(opts: { apiKey?: string; timeouts?: Partial<UpstreamTimeouts> } = {}) {
  const p = createAnthropicProvider({
    id: "claude",
    baseUrl: fake.url.replace(/\/v1$/, ""),
    timeouts: { ...TIMEOUTS, ...opts.timeouts },
    apiKey: opts.apiKey ?? KEY,
  });
  providers.push(p);
  return p;
}

const MESSAGES = [
  { role: "system", content: "Be brief." },
  { role: "user", content: "Tell me a story" },
];

const chat = (extra: Record<string, unknown> = {}): ProviderRequest => ({
  operation: "chat",
  body: { model: "fake-small", messages: MESSAGES, max_tokens: 5, ...extra },
});

const streamChat = (extra: Record<string, unknown> = {}): ProviderRequest =>
  chat({ stream: true, stream_options: { include_usage: true }, ...extra });

const text = (chunks: ProviderChunk[]) =>
  chunks
    .map((c) => (c.json.choices as Array<{ delta?: { content?: string } }>)[0]?.delta?.content ?? "")
    .join("");
const lastRequest = () => fake.requests.at(-1)!;
const signal = () => new AbortController().signal;
/** What the fake's chat endpoint answers for the same conversation: the same words and counts. */
const asChat = (extra: Record<string, unknown> = {}) => expectedOutput(chat(extra).body);

describe("Anthropic request mapping", () => {
  it("lifts system messages, sends the cap as max_tokens, stop as stop_sequences, sampling as given", () => {
    const body = messagesBody(
      chat({
        messages: [
          { role: "system", content: "Be brief." },
          { role: "developer", content: [{ type: "text", text: "No lists." }] },
          { role: "user", content: "Hi" },
          { role: "assistant", content: "Hello" },
          { role: "user", content: [{ type: "text", text: "Go on" }] },
        ],
        max_tokens: undefined,
        max_completion_tokens: 7,
        stop: "END",
        temperature: 0.2,
        top_p: 0.9,
        user: "u-1",
        seed: 4,
        stream_options: { include_usage: true },
      }),
      true,
    );
    expect(body).toEqual({
      model: "fake-small",
      max_tokens: 7,
      system: [
        { type: "text", text: "Be brief." },
        { type: "text", text: "No lists." },
      ],
      messages: [
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello" },
        { role: "user", content: [{ type: "text", text: "Go on" }] },
      ],
      stop_sequences: ["END"],
      temperature: 0.2,
      top_p: 0.9,
      metadata: { user_id: "u-1" },
      stream: true,
    });
    expect(messagesBody(chat({ stop: ["a", "b"] }), false)).toMatchObject({
      system: "Be brief.",
      stop_sequences: ["a", "b"],
    });
    expect(messagesBody(chat(), false)).not.toHaveProperty("stream");
    expect(
      messagesBody({ operation: "text", body: { model: "m", prompt: ["Once"], max_tokens: 3 } }, false),
    ).toEqual({ model: "m", max_tokens: 3, messages: [{ role: "user", content: "Once" }] });
  });

  it.each([
    ["n above 1", chat({ n: 2 }), "`n` above 1"],
    ["logprobs", chat({ logprobs: true }), "`logprobs`"],
    ["top_logprobs", chat({ top_logprobs: 2 }), "`top_logprobs`"],
    ["tools", chat({ tools: [{ type: "function", function: { name: "f" } }] }), "`tools`"],
    ["penalties", chat({ presence_penalty: 0.5 }), "`presence_penalty`"],
    ["json mode", chat({ response_format: { type: "json_object" } }), "`response_format`"],
    ["temperature above 1", chat({ temperature: 1.5 }), "temperature above 1"],
    ["tool messages", chat({ messages: [{ role: "tool", content: "x" }] }), "role 'tool'"],
    ["image parts", chat({ messages: [{ role: "user", content: [{ type: "image_url" }] }] }), "'image_url'"],
    ["no output cap", chat({ max_tokens: undefined }), "needs an output cap"],
    [
      "a prompt list",
      { operation: "text", body: { model: "m", prompt: ["a", "b"], max_tokens: 3 } },
      "a list of prompts",
    ],
    [
      "best_of",
      { operation: "text", body: { model: "m", prompt: "a", best_of: 2, max_tokens: 3 } },
      "`best_of`",
    ],
    [
      "token prompts",
      { operation: "text", body: { model: "m", prompt: [1, 2], max_tokens: 3 } },
      "token ids",
    ],
    ["embeddings", { operation: "embeddings", body: { model: "m", input: "a" } }, "embeddings"],
  ] as Array<[string, ProviderRequest, string]>)("refuses %s before any call", async (_, req, says) => {
    const before = fake.requests.length;
    const err = await failure(provider().complete(req, signal()));
    expect(err.code).toBe("invalid_request");
    expect(err.upstream).toBeUndefined();
    expect(err.message).toContain("Anthropic Messages API");
    expect(err.message).toContain(says);
    await failure(drain(provider().stream(req, signal())));
    expect(fake.requests.length).toBe(before);
  });
});

describe("Anthropic provider", () => {
  it("runs a buffered chat completion on /v1/messages with its key and version, as a chat completion", async () => {
    const result = await provider().complete(chat(), signal());
    const expected = asChat();
    expect(result.json).toMatchObject({
      object: "chat.completion",
      model: "fake-small",
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: expected.texts[0] },
          finish_reason: "length",
        },
      ],
      usage: {
        prompt_tokens: expected.usage.prompt_tokens,
        completion_tokens: 5,
        total_tokens: expected.usage.prompt_tokens + 5,
      },
    });
    expect(result.json.id).toMatch(/^msg_/);
    expect(result.usage).toEqual({
      inputTokens: expected.usage.prompt_tokens,
      outputTokens: 5,
      reasoningTokens: 0,
    });
    const sent = lastRequest();
    expect(sent.path).toBe("/v1/messages");
    expect(sent.headers["x-api-key"]).toBe(KEY);
    expect(sent.headers["anthropic-version"]).toBe(ANTHROPIC_VERSION);
    expect(sent.headers.authorization).toBeUndefined();
    expect(sent.body).toEqual({
      model: "fake-small",
      max_tokens: 5,
      system: "Be brief.",
      messages: [{ role: "user", content: "Tell me a story" }],
    });
  });

  it("answers a single-prompt text completion as a text completion", async () => {
    const body = { model: "fake-small", prompt: "Once upon a time", max_tokens: 3 };
    const result = await provider().complete({ operation: "text", body }, signal());
    const expected = expectedOutput(body, { route: "completions" });
    expect(result.json).toMatchObject({
      object: "text_completion",
      choices: [{ index: 0, text: expected.texts[0], finish_reason: "length" }],
    });
    expect(result.usage).toEqual({
      inputTokens: expected.usage.prompt_tokens,
      outputTokens: 3,
      reasoningTokens: 0,
    });
  });

  it("streams a text completion as text_completion chunks, no role chunk, the usage last", async () => {
    const body = { model: "fake-small", prompt: "Once upon a time", max_tokens: 3, stream: true };
    const chunks = await drain(provider().stream({ operation: "text", body }, signal()));
    const expected = expectedOutput(body, { route: "completions" });
    const texts = chunks.map((c) => (c.json.choices as Array<{ text?: string }>)[0]?.text ?? "");
    expect(texts.join("")).toBe(expected.texts[0]);
    // three words, finish, usage
    expect(chunks).toHaveLength(5);
    expect(chunks.every((c) => c.json.object === "text_completion")).toBe(true);
    expect(chunks[3]!.json.choices).toEqual([
      { index: 0, text: "", finish_reason: "length", logprobs: null },
    ]);
    expect(chunks[4]!.usage).toEqual({
      inputTokens: expected.usage.prompt_tokens,
      outputTokens: 3,
      reasoningTokens: 0,
    });
  });

  it("streams chat chunks: a role chunk, one per text delta, the finish, then the usage chunk", async () => {
    const chunks = await drain(provider().stream(streamChat(), signal()));
    const expected = asChat();
    expect(text(chunks)).toBe(expected.texts[0]);
    // role, five words, finish, usage
    expect(chunks).toHaveLength(8);
    expect(chunks[0]!.json).toMatchObject({
      object: "chat.completion.chunk",
      choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }],
    });
    expect(chunks[6]!.json.choices).toEqual([
      { index: 0, delta: {}, finish_reason: "length", logprobs: null },
    ]);
    const last = chunks.at(-1)!;
    expect(last.json.choices).toEqual([]);
    expect(last.json.usage).toEqual({
      prompt_tokens: expected.usage.prompt_tokens,
      completion_tokens: 5,
      total_tokens: expected.usage.prompt_tokens + 5,
    });
    expect(last.usage).toEqual({
      inputTokens: expected.usage.prompt_tokens,
      outputTokens: 5,
      reasoningTokens: 0,
    });
    expect(lastRequest().body).toMatchObject({ stream: true });
    expect(lastRequest().body).not.toHaveProperty("stream_options");
    expect(lastRequest().headers.accept).toBe("text/event-stream");
  });

  it("counts a stream cut short: exact input tokens from message_start, one output token per delta", async () => {
    fake.failNext(1, { afterChunks: 3 });
    const chunks: ProviderChunk[] = [];
    const err = await failure(drain(provider().stream(streamChat(), signal()), chunks));
    expect(err.upstream?.kind).toBe("interrupted");
    expect(chunks).toHaveLength(4);
    expect(chunks.at(-1)!.usage).toEqual({
      inputTokens: asChat().usage.prompt_tokens,
      outputTokens: 3,
      reasoningTokens: 0,
    });
  });

  it.each([
    [529, "upstream_error", "status_5xx"],
    [500, "upstream_error", "status_5xx"],
    [429, "upstream_error", "status_429"],
    [401, "upstream_error", "status_auth"],
    [403, "upstream_error", "status_auth"],
    [400, "upstream_rejected", "status_4xx"],
    [404, "upstream_rejected", "status_4xx"],
    [413, "upstream_rejected", "status_4xx"],
  ])("maps an Anthropic %i to %s (%s)", async (status, code, kind) => {
    fake.failNext(2, { status, retryAfter: "7" });
    const buffered = await failure(provider().complete(chat(), signal()));
    const streamed = await failure(drain(provider().stream(streamChat(), signal())));
    for (const err of [buffered, streamed]) {
      expect(err.code).toBe(code);
      expect(err.upstream?.kind).toBe(kind);
      // Retry-After is honoured on 429 and 529 only.
      expect(err.upstream?.retryAfterMs).toBe(status === 429 || status === 529 ? 7_000 : undefined);
      // A refused request tells the caller why, in Anthropic's words.
      if (code === "upstream_rejected") expect(err.message).toBe(`injected failure (status ${status})`);
    }
  });

  it("fails a stream on an error event by its type: overloaded is retryable, an invalid request is not", async () => {
    fake.failNext(1, { errorEvent: "overloaded_error" });
    const chunks: ProviderChunk[] = [];
    const overloaded = await failure(drain(provider().stream(streamChat(), signal()), chunks));
    expect(overloaded.upstream?.kind).toBe("status_5xx");
    // Nothing went on before the event: another upstream may still answer.
    expect(chunks).toHaveLength(0);
    fake.failNext(1, { errorEvent: "invalid_request_error", afterChunks: 2 });
    const rejected = await failure(drain(provider().stream(streamChat(), signal())));
    expect(rejected.code).toBe("upstream_rejected");
    expect(rejected.upstream?.kind).toBe("status_4xx");
  });

  it("refuses a wrong key as the gateway's own credentials (status_auth)", async () => {
    const err = await failure(provider({ apiKey: "sk-wrong" }).complete(chat(), signal()));
    expect(err.upstream?.kind).toBe("status_auth");
  });

  it("times out on the shared first-token clock", async () => {
    fake.configure({ firstByteDelayMs: 400 });
    const err = await failure(provider({ timeouts: { firstTokenMs: 100 } }).complete(chat(), signal()));
    expect(err.code).toBe("upstream_timeout");
    expect(err.upstream?.kind).toBe("timeout");
  });

  it("probes with a one-token message and reports how a probe failed", async () => {
    expect(await provider().probe({ operation: "chat", model: "fake-small" })).toBeUndefined();
    expect(lastRequest().body).toEqual({
      model: "fake-small",
      max_tokens: 1,
      messages: [{ role: "user", content: "Say OK." }],
    });
    fake.failNext(1, { status: 529 });
    expect(await provider().probe({ operation: "chat", model: "fake-small" })).toBe("status_5xx");
  });
});

describe("Anthropic stream events", () => {
  const decode = (events: Array<Record<string, unknown>>) => {
    const next = streamDecoder(chat());
    return events.map((e) => next(JSON.stringify(e)));
  };

  it("counts cache writes and reads as input, reports cached tokens, and prefers message_delta's input", () => {
    const start = {
      type: "message_start",
      message: {
        id: "msg_1",
        model: "claude",
        usage: { input_tokens: 10, cache_creation_input_tokens: 5, cache_read_input_tokens: 20 },
      },
    };
    const out = decode([
      start,
      { type: "ping" },
      { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
      { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "Hi" } },
      { type: "content_block_stop", index: 0 },
      { type: "message_delta", delta: { stop_reason: "end_turn" }, usage: { output_tokens: 9 } },
      { type: "message_stop" },
    ]);
    // The role chunk waits for the first text, then carries message_start's input.
    expect(out[0]!.chunks).toEqual([]);
    expect(out[1]!.chunks).toEqual([]);
    expect(out[3]!.chunks.map((c) => c.usage)).toEqual([
      undefined,
      { inputTokens: 35, outputTokens: 1, reasoningTokens: 0 },
    ]);
    expect(out[5]!.chunks[0]!.json.choices).toEqual([
      { index: 0, delta: {}, finish_reason: "stop", logprobs: null },
    ]);
    expect(out[6]!.done).toBe(true);
    expect(out[6]!.chunks[0]!.usage).toEqual({ inputTokens: 35, outputTokens: 9, reasoningTokens: 0 });
    expect(out[6]!.chunks[0]!.json.usage).toEqual({
      prompt_tokens: 35,
      completion_tokens: 9,
      total_tokens: 44,
      prompt_tokens_details: { cached_tokens: 20 },
    });
    const later = decode([
      start,
      {
        type: "message_delta",
        delta: { stop_reason: "max_tokens" },
        usage: { input_tokens: 12, output_tokens: 3 },
      },
      { type: "message_stop" },
    ]);
    // No text at all: the role chunk goes out with the finish.
    expect(later[1]!.chunks.map((c) => c.json.choices)).toMatchObject([
      [{ delta: { role: "assistant" } }],
      [{ finish_reason: "length" }],
    ]);
    expect(later[2]!.chunks[0]!.usage).toEqual({ inputTokens: 37, outputTokens: 3, reasoningTokens: 0 });
  });

  it("gives no usage for counts that are not counts (the router then estimates): never a free answer", () => {
    const message = (usage: Record<string, unknown>) => ({
      type: "message",
      id: "msg_1",
      model: "claude",
      content: [{ type: "text", text: "Hi" }],
      stop_reason: "end_turn",
      usage,
    });
    const bad = [-1000, 1.5, "10", Number.NaN, null];
    for (const v of bad) {
      for (const usage of [
        { input_tokens: v, output_tokens: 5 },
        { input_tokens: 5, output_tokens: v },
        { input_tokens: 5, output_tokens: 5, cache_read_input_tokens: v === null ? -1 : v },
      ]) {
        const answer = completionOf(message(usage), chat());
        expect(answer.usage).toBeUndefined();
        expect(answer.json).not.toHaveProperty("usage");
      }
    }
    // A completed message without its output count has no count either.
    expect(completionOf(message({ input_tokens: 5 }), chat()).usage).toBeUndefined();
    // Absent or null cache counts are no cache use: still the upstream's count.
    expect(
      completionOf(message({ input_tokens: 5, output_tokens: 2, cache_creation_input_tokens: null }), chat())
        .usage,
    ).toEqual({ inputTokens: 5, outputTokens: 2, reasoningTokens: 0 });

    const text = { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "Hi" } };
    const stop = { type: "message_stop" };
    // message_start's input is not a count: the text chunks carry none, nor does the usage chunk.
    const badInput = decode([
      { type: "message_start", message: { id: "msg_1", usage: { input_tokens: -1000, output_tokens: 1 } } },
      text,
      { type: "message_delta", delta: { stop_reason: "end_turn" }, usage: { output_tokens: 9 } },
      stop,
    ]);
    expect(badInput[1]!.chunks.map((c) => c.usage)).toEqual([undefined, undefined]);
    expect(badInput[3]!.chunks[0]!.usage).toBeUndefined();
    expect(badInput[3]!.chunks[0]!.json).not.toHaveProperty("usage");
    expect(badInput[3]!.chunks[0]!.json.choices).toEqual([]);
    // message_delta's output is not a count (or is missing): the usage chunk carries none.
    for (const usage of [{ output_tokens: -5 }, { output_tokens: "9" }, {}]) {
      const badOutput = decode([
        { type: "message_start", message: { id: "msg_1", usage: { input_tokens: 10 } } },
        text,
        { type: "message_delta", delta: { stop_reason: "end_turn" }, usage },
        stop,
      ]);
      expect(badOutput[1]!.chunks[1]!.usage).toEqual({
        inputTokens: 10,
        outputTokens: 1,
        reasoningTokens: 0,
      });
      expect(badOutput[3]!.chunks[0]!.usage).toBeUndefined();
    }
    // message_delta's repeated input that is not a count does not replace message_start's.
    const badRepeat = decode([
      { type: "message_start", message: { id: "msg_1", usage: { input_tokens: 10 } } },
      text,
      {
        type: "message_delta",
        delta: { stop_reason: "end_turn" },
        usage: { input_tokens: -1, output_tokens: 4 },
      },
      stop,
    ]);
    expect(badRepeat[3]!.chunks[0]!.usage).toEqual({ inputTokens: 10, outputTokens: 4, reasoningTokens: 0 });
  });

  it("treats message_stop before message_delta, or an unreadable event, as an interrupted answer", () => {
    const next = streamDecoder(chat());
    expect(() => next(JSON.stringify({ type: "message_stop" }))).toThrow(InferenceError);
    expect(() => streamDecoder(chat())("{not json")).toThrow("unreadable");
  });
});
