import { costOf, type ModelConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { completionOf, streamDecoder } from "../adapters/anthropic/response.js";
import { normaliseUsage } from "../adapters/openai-compatible/provider.js";
import { Catalog } from "./catalog.js";
import { InferenceError } from "./errors.js";
import { type CompletionInput, Inference, type StreamEvent } from "./inference.js";
import type {
  Provider,
  ProviderChunk,
  ProviderRequest,
  ProviderResult,
  TokenCounts,
  UsageEvent,
  UsagePublisher,
} from "./ports.js";

const PRICES = { inputPerMillion: 2_000n, outputPerMillion: 7_000_000n };
const SNAPSHOT = "ps_test_snapshot";

const MODEL: ModelConfig = {
  id: "public-small",
  upstream: "up-1",
  upstreamModel: "org/small-7b",
  runtime: "vllm",
  pricing: PRICES,
  maxOutputTokens: 4096,
  reasoning: false,
  kind: "chat",
};

/** A model whose configuration says it reasons. */
const REASONER: ModelConfig = { ...MODEL, id: "public-reasoner", upstreamModel: "org/r1", reasoning: true };

/** An embedding model, priced per input token only. */
const EMBEDDER: ModelConfig = {
  ...MODEL,
  id: "public-embed",
  upstreamModel: "org/embed",
  kind: "embedding",
  dimensions: 8,
  pricing: { inputPerMillion: 30_000n, outputPerMillion: 0n },
};

const BILLING = {
  door: "paid",
  accountId: "acct_1",
  connectionId: "conn_1",
  keyId: "key_1",
  reservationId: "res_1",
} as const;

/** Scripted upstream behaviour for one fake provider. */
interface Script {
  result?: ProviderResult;
  chunks?: ProviderChunk[];
  /** Throw this after yielding `throwAfter` chunks (0: before any chunk). */
  error?: Error;
  throwAfter?: number;
}

/** A Provider that answers from a script and records what it was asked. */
class FakeProvider implements Provider {
  readonly id = "up-1";
  readonly requests: ProviderRequest[] = [];
  /** Set once the stream generator finished, however it finished (return() included). */
  streamClosed = false;
  constructor(public script: Script = {}) {}

  async complete(req: ProviderRequest): Promise<ProviderResult> {
    this.requests.push(structuredClone(req));
    if (this.script.error) throw this.script.error;
    if (!this.script.result) throw new Error("no scripted result");
    return structuredClone(this.script.result);
  }

  async *stream(req: ProviderRequest, signal: AbortSignal): AsyncGenerator<ProviderChunk> {
    this.requests.push(structuredClone(req));
    try {
      const chunks = structuredClone(this.script.chunks ?? []);
      for (const [i, chunk] of chunks.entries()) {
        if (this.script.error && this.script.throwAfter === i) throw this.script.error;
        if (signal.aborted) throw signal.reason;
        await Promise.resolve();
        yield chunk;
      }
      if (this.script.error) throw this.script.error;
    } finally {
      this.streamClosed = true;
    }
  }
}

/** Keeps every published event in memory; can be told to fail. */
class MemoryPublisher implements UsagePublisher {
  readonly events: UsageEvent[] = [];
  failing = false;
  async publish(event: UsageEvent): Promise<void> {
    if (this.failing) throw new Error("bus down");
    this.events.push(event);
  }
}

function setup(script: Script = {}) {
  const provider = new FakeProvider(script);
  const publisher = new MemoryPublisher();
  let n = 0;
  const inference = new Inference(
    new Catalog([MODEL, REASONER, EMBEDDER], new Map([["up-1", provider]])),
    publisher,
    SNAPSHOT,
    () => `evt_${++n}`,
  );
  return { provider, publisher, inference };
}

function input(overrides: Partial<CompletionInput> = {}): CompletionInput {
  const body = overrides.body ?? {
    model: "public-small",
    messages: [{ role: "user", content: "Say something" }],
  };
  return {
    requestId: "req_1",
    operation: "chat",
    model: "public-small",
    maxOutputTokens: 64,
    body,
    billing: BILLING,
    ...overrides,
  };
}

const usage = (inputTokens: number, outputTokens: number, reasoningTokens = 0): TokenCounts => ({
  inputTokens,
  outputTokens,
  reasoningTokens,
});

function chatResult(content: string, u: TokenCounts | undefined): ProviderResult {
  return {
    json: {
      id: "chatcmpl-1",
      object: "chat.completion",
      model: "org/small-7b",
      choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }],
      ...(u ? { usage: { prompt_tokens: u.inputTokens, completion_tokens: u.outputTokens } } : {}),
    },
    usage: u,
  };
}

const roleChunk = (): ProviderChunk => ({
  json: { model: "org/small-7b", choices: [{ index: 0, delta: { role: "assistant", content: "" } }] },
  usage: undefined,
});
const textChunk = (content: string): ProviderChunk => ({
  json: { model: "org/small-7b", choices: [{ index: 0, delta: { content }, finish_reason: null }] },
  usage: undefined,
});
const finishChunk = (): ProviderChunk => ({
  json: { model: "org/small-7b", choices: [{ index: 0, delta: {}, finish_reason: "stop" }] },
  usage: undefined,
});
const usageChunk = (u: TokenCounts): ProviderChunk => ({
  json: {
    model: "org/small-7b",
    choices: [],
    usage: { prompt_tokens: u.inputTokens, completion_tokens: u.outputTokens },
  },
  usage: u,
});

/** A whole upstream stream: role, three words, finish, usage. */
const fullStream = (u: TokenCounts) => [
  roleChunk(),
  textChunk("one "),
  textChunk("two "),
  textChunk("three "),
  finishChunk(),
  usageChunk(u),
];

async function drain(events: AsyncIterable<StreamEvent>): Promise<StreamEvent[]> {
  const out: StreamEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}

const chunksOf = (events: StreamEvent[]) =>
  events.flatMap((e) => ("chunk" in e ? [e.chunk as Record<string, unknown>] : []));
const usagesOf = (events: StreamEvent[]) => events.flatMap((e) => ("usage" in e ? [e.usage] : []));

/** The events a stream gave before it failed, and its failure (a stream that ends is a test failure). */
async function eventsUntilFailure(
  events: AsyncIterable<StreamEvent>,
): Promise<{ received: StreamEvent[]; err: unknown }> {
  const received: StreamEvent[] = [];
  const err = await rejection(
    (async () => {
      for await (const event of events) received.push(event);
    })(),
  );
  return { received, err };
}

async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => expect.unreachable("expected a rejection"),
    (err: unknown) => err,
  );
}

describe("Inference.complete", () => {
  it("sends the upstream model id and the cap as max_tokens, and answers with the public id", async () => {
    const { provider, inference } = setup({ result: chatResult("hello there", usage(12, 3)) });
    const body = { model: "public-small", messages: [{ role: "user", content: "hi" }], stream: false };
    const { json } = await inference.complete(input({ body }), new AbortController().signal);

    expect(json.model).toBe("public-small");
    expect(provider.requests).toHaveLength(1);
    const sent = provider.requests[0]!;
    expect(sent.operation).toBe("chat");
    expect(sent.body).toEqual({
      model: "org/small-7b",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 64,
    });
  });

  it("overrides the caller's own cap with the authorized one", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const body = { model: "public-small", messages: [{ role: "user", content: "hi" }], max_tokens: 9000 };
    await inference.complete(input({ body, maxOutputTokens: 100 }), new AbortController().signal);
    expect(provider.requests[0]!.body.max_tokens).toBe(100);
  });

  it("forwards the cap as max_completion_tokens when the caller used that field", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const body = {
      model: "public-small",
      messages: [{ role: "user", content: "hi" }],
      max_completion_tokens: 500,
    };
    await inference.complete(input({ body, maxOutputTokens: 32 }), new AbortController().signal);
    const sent = provider.requests[0]!.body;
    expect(sent.max_completion_tokens).toBe(32);
    expect(sent).not.toHaveProperty("max_tokens");
  });

  it("forwards exactly one cap, the smallest of the authorized cap and every alias the caller sent", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const body = {
      model: "public-small",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 1_000_000,
      max_completion_tokens: 1,
      max_output_tokens: 50,
    };
    await inference.complete(input({ body, maxOutputTokens: 100 }), new AbortController().signal);
    const sent = provider.requests[0]!.body;
    expect(sent.max_tokens).toBe(1);
    expect(sent).not.toHaveProperty("max_completion_tokens");
    expect(sent).not.toHaveProperty("max_output_tokens");
    // A text completion gets max_tokens, whatever alias the caller used.
    await inference.complete(
      input({ operation: "text", body: { prompt: "p", max_completion_tokens: 7 }, maxOutputTokens: 64 }),
      new AbortController().signal,
    );
    expect(provider.requests[1]!.body).toMatchObject({ max_tokens: 7 });
    expect(provider.requests[1]!.body).not.toHaveProperty("max_completion_tokens");
  });

  it("forwards no inference server's own length field (llama.cpp's n_predict, TGI's max_new_tokens, Ollama's num_predict, also inside options): one can only lower the cap", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const body = {
      model: "public-small",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 1,
      n_predict: 100_000,
      max_new_tokens: 100_000,
      num_predict: -1,
      max_tokens_to_sample: 100_000,
      options: { num_predict: 100_000, temperature: 0.5 },
      parameters: { max_new_tokens: 100_000 },
      ignore_eos: true,
    };
    await inference.complete(input({ body, maxOutputTokens: 100 }), new AbortController().signal);
    const sent = provider.requests[0]!.body;
    expect(sent).toEqual({
      model: "org/small-7b",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 1,
      options: { temperature: 0.5 },
      parameters: {},
      ignore_eos: true,
    });
    // The caller's body is left as it came (it is also read for the usage estimate).
    expect(body.options).toEqual({ num_predict: 100_000, temperature: 0.5 });
    // A smaller runtime field lowers the one cap forwarded.
    await inference.complete(
      input({ body: { model: "public-small", messages: [], n_predict: 7 }, maxOutputTokens: 100 }),
      new AbortController().signal,
    );
    expect(provider.requests[1]!.body).toMatchObject({ max_tokens: 7 });
    expect(provider.requests[1]!.body).not.toHaveProperty("n_predict");
  });

  it("forwards a paid-door request without the paid door's own fields (plan, model_optimization)", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const body = {
      plan: "Starter",
      model_optimization: true,
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    };
    await inference.complete(
      input({ body, maxOutputTokens: 4, billing: { ...BILLING, door: "paid" } }),
      new AbortController().signal,
    );
    expect(provider.requests[0]!.body).toEqual({
      model: "org/small-7b",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
    });
  });

  it("charges no more than the quote and reports the excess when the upstream produces more", async () => {
    const provider = new FakeProvider({ result: chatResult("x", usage(10, 100_000)) });
    const publisher = new MemoryPublisher();
    const over: unknown[] = [];
    const inference = new Inference(
      new Catalog([MODEL], new Map([["up-1", provider]])),
      publisher,
      SNAPSHOT,
      () => "evt_1",
      (o) => over.push(o),
    );
    const quote = 1_000n;
    const { usage: summary } = await inference.complete(
      input({ billing: { ...BILLING, quote } }),
      new AbortController().signal,
    );
    const uncapped = costOf(usage(10, 100_000), PRICES);
    expect(uncapped).toBeGreaterThan(quote);
    expect(summary.cost).toBe(quote);
    expect(publisher.events[0]!.cost).toBe(quote);
    // The tokens are recorded as reported; only the charge is capped.
    expect(publisher.events[0]!.tokens).toEqual(usage(10, 100_000));
    expect(over).toEqual([
      { requestId: "req_1", model: "public-small", door: BILLING.door, upstreamId: "up-1", uncapped, quote },
    ]);
    // Within the quote nothing changes and nothing is reported.
    await inference.complete(
      input({ billing: { ...BILLING, quote: uncapped } }),
      new AbortController().signal,
    );
    expect(publisher.events[1]!.cost).toBe(uncapped);
    expect(over).toHaveLength(1);
  });

  it("leaves the body's cap alone when no cap was authorized", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const { maxOutputTokens: _, ...noCap } = input();
    await inference.complete(noCap, new AbortController().signal);
    const sent = provider.requests[0]!.body;
    expect(sent).not.toHaveProperty("max_tokens");
    expect(sent).not.toHaveProperty("max_completion_tokens");
  });

  it("publishes exactly one event priced from the reported usage with the snapshot id", async () => {
    const { publisher, inference } = setup({ result: chatResult("hello there", usage(1_234, 567, 89)) });
    const { usage: summary } = await inference.complete(input(), new AbortController().signal);

    const cost = costOf({ inputTokens: 1_234, outputTokens: 567 }, PRICES);
    // 1234 * 2000 + 567 * 7_000_000 = 3_971_468_000 → ceil(/1e6) = 3972: the rounding is up.
    expect(cost).toBe(3_972n);
    expect(summary).toEqual({
      ...usage(1_234, 567, 89),
      cost,
      pricingSnapshotId: SNAPSHOT,
      eventId: "evt_1",
    });
    expect(publisher.events).toHaveLength(1);
    const event = publisher.events[0]!;
    expect(event).toMatchObject({
      eventId: "evt_1",
      requestId: "req_1",
      ...BILLING,
      model: "public-small",
      runtime: "vllm",
      upstreamId: "up-1",
      tokens: usage(1_234, 567, 89),
      cost,
      pricingSnapshotId: SNAPSHOT,
      outcome: "completed",
      streamed: false,
    });
    expect(event.occurredAt).toBeInstanceOf(Date);
  });

  it("records the upstream that served, buffered or streamed, when the provider names it", async () => {
    const { publisher, inference } = setup({
      result: { ...chatResult("x", usage(1, 1)), upstreamId: "up-2" },
      chunks: fullStream(usage(2, 3)).map((c) => ({ ...c, upstreamId: "up-3" })),
    });
    await inference.complete(input(), new AbortController().signal);
    for await (const _ of inference.stream(input(), false, new AbortController().signal)) {
      // drain
    }
    expect(publisher.events.map((e) => e.upstreamId)).toEqual(["up-2", "up-3"]);
  });

  it("estimates usage from the prompt text and the answer when the upstream reports none", async () => {
    const content = "naïve café answer"; // 19 bytes of UTF-8 for 17 characters
    const { publisher, inference } = setup({ result: chatResult(content, undefined) });
    const { usage: summary } = await inference.complete(input(), new AbortController().signal);

    // "Say something": 13 bytes of prompt text; the JSON around it is not input.
    const tokens = usage(Math.ceil(13 / 4), Math.ceil(Buffer.byteLength(content) / 4), 0);
    expect(tokens).toEqual(usage(4, 5, 0));
    expect(summary).toEqual({
      ...tokens,
      cost: costOf(tokens, PRICES),
      pricingSnapshotId: SNAPSHOT,
      eventId: publisher.events[0]!.eventId,
    });
    expect(publisher.events.map((e) => e.tokens)).toEqual([tokens]);
  });

  it("estimates the output of a text completion from choices[0].text", async () => {
    const { publisher, inference } = setup({
      result: { json: { choices: [{ index: 0, text: "0123456789abc" }] }, usage: undefined },
    });
    await inference.complete(
      input({ operation: "text", body: { model: "public-small", prompt: "p" } }),
      new AbortController().signal,
    );
    expect(publisher.events[0]!.tokens).toEqual(usage(1, 4, 0));
  });

  describe("usage counts that are not counts (negative, a string), read by the adapters", () => {
    /** An upstream whose raw answers are read as an adapter reads them off the wire. */
    class WireProvider implements Provider {
      readonly id = "up-1";
      constructor(
        private readonly answer: (req: ProviderRequest) => ProviderResult,
        private readonly events: (req: ProviderRequest) => ProviderChunk[],
      ) {}
      async complete(req: ProviderRequest): Promise<ProviderResult> {
        return this.answer(req);
      }
      async *stream(req: ProviderRequest): AsyncGenerator<ProviderChunk> {
        for (const chunk of this.events(req)) {
          await Promise.resolve();
          yield chunk;
        }
      }
    }
    const wired = (provider: Provider) => {
      const publisher = new MemoryPublisher();
      const inference = new Inference(
        new Catalog([MODEL], new Map([["up-1", provider]])),
        publisher,
        SNAPSHOT,
        () => "evt_1",
      );
      return { publisher, inference };
    };
    const content = "naïve café answer";
    // "Say something": 13 bytes of prompt text (4 tokens); the answer's 19 bytes (5 tokens), or
    // one token per streamed text chunk.
    const bufferedEstimate = usage(4, 5, 0);
    const streamedEstimate = usage(4, 3, 0);
    const charged = async (provider: Provider) => {
      const { publisher, inference } = wired(provider);
      const { usage: buffered } = await inference.complete(input(), new AbortController().signal);
      const [streamed] = usagesOf(await drain(inference.stream(input(), true, new AbortController().signal)));
      return { buffered, streamed: streamed!, published: publisher.events.map((e) => [e.tokens, e.cost]) };
    };

    it("OpenAI-compatible: charged the estimate, not nothing", async () => {
      const bogus = { prompt_tokens: -1000, completion_tokens: "5" };
      const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) => ({
        json: { model: "org/small-7b", choices, usage: null, ...extra },
      });
      const raw = [
        chunk([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]),
        chunk([{ index: 0, delta: { content: "one " }, finish_reason: null }]),
        chunk([{ index: 0, delta: { content: "two " }, finish_reason: null }]),
        chunk([{ index: 0, delta: { content: "three" }, finish_reason: null }]),
        chunk([{ index: 0, delta: {}, finish_reason: "stop" }]),
        chunk([], { usage: bogus }),
      ];
      const { buffered, streamed, published } = await charged(
        new WireProvider(
          (req) => {
            const json = { ...chatResult(content, undefined).json, usage: bogus };
            return { json, usage: normaliseUsage(json.usage, req.operation) };
          },
          (req) => raw.map(({ json }) => ({ json, usage: normaliseUsage(json.usage, req.operation) })),
        ),
      );
      expect(buffered).toMatchObject({ ...bufferedEstimate, cost: costOf(bufferedEstimate, PRICES) });
      expect(streamed).toMatchObject({ ...streamedEstimate, cost: costOf(streamedEstimate, PRICES) });
      expect(buffered.cost).toBeGreaterThan(0n);
      expect(streamed.cost).toBeGreaterThan(0n);
      expect(published).toEqual([
        [bufferedEstimate, costOf(bufferedEstimate, PRICES)],
        [streamedEstimate, costOf(streamedEstimate, PRICES)],
      ]);
    });

    it("OpenAI-compatible: the answer's usage tells the estimate it was billed on, not the upstream's", async () => {
      const bogus = {
        prompt_tokens: -1000,
        completion_tokens: "5",
        prompt_tokens_details: { cached_tokens: 0 },
      };
      const told = {
        prompt_tokens: 4,
        completion_tokens: 5,
        total_tokens: 9,
        prompt_tokens_details: { cached_tokens: 0 },
      };
      const { inference } = wired(
        new WireProvider(
          (req) => {
            const json = { ...chatResult(content, undefined).json, usage: bogus };
            return { json, usage: normaliseUsage(json.usage, req.operation) };
          },
          (req) =>
            [
              { model: "m", choices: [{ index: 0, delta: { content: "one " }, finish_reason: null }] },
              { model: "m", choices: [{ index: 0, delta: { content: "two" }, finish_reason: "stop" }] },
              { model: "m", choices: [], usage: bogus },
            ].map((json) => ({ json, usage: normaliseUsage(json.usage, req.operation) })),
        ),
      );
      const { json, usage: billed } = await inference.complete(input(), new AbortController().signal);
      expect(billed).toMatchObject(bufferedEstimate);
      expect(json.usage).toEqual(told);
      const events = await drain(inference.stream(input(), true, new AbortController().signal));
      const usageChunk = events.flatMap((e) =>
        "chunk" in e && (e.chunk.choices as unknown[]).length === 0 ? [e.chunk] : [],
      );
      expect(usagesOf(events)[0]).toMatchObject(usage(4, 2, 0));
      expect(usageChunk.map((c) => c.usage)).toEqual([
        {
          prompt_tokens: 4,
          completion_tokens: 2,
          total_tokens: 6,
          prompt_tokens_details: { cached_tokens: 0 },
        },
      ]);
      // Counts the upstream did send are told as they came.
      const honest = setup({ result: chatResult("x", usage(7, 1)) });
      const answered = await honest.inference.complete(input(), new AbortController().signal);
      expect(answered.json.usage).toEqual({ prompt_tokens: 7, completion_tokens: 1 });
    });

    it("Anthropic: charged the estimate (or its exact input and counted output), not nothing", async () => {
      const message = {
        type: "message",
        id: "msg_1",
        model: "claude",
        content: [{ type: "text", text: content }],
        stop_reason: "end_turn",
        usage: { input_tokens: "10", output_tokens: -5 },
      };
      const events = (startUsage: Record<string, unknown>) => [
        { type: "message_start", message: { id: "msg_1", model: "claude", usage: startUsage } },
        ...["one ", "two ", "three"].map((text) => ({
          type: "content_block_delta",
          index: 0,
          delta: { type: "text_delta", text },
        })),
        { type: "message_delta", delta: { stop_reason: "end_turn" }, usage: { output_tokens: -5 } },
        { type: "message_stop" },
      ];
      const provider = (startUsage: Record<string, unknown>) =>
        new WireProvider(
          (req) => completionOf(message, req),
          (req) => {
            const next = streamDecoder(req);
            return events(startUsage).flatMap((e) => next(JSON.stringify(e)).chunks);
          },
        );
      const { buffered, streamed } = await charged(provider({ input_tokens: -1000, output_tokens: 1 }));
      expect(buffered).toMatchObject({ ...bufferedEstimate, cost: costOf(bufferedEstimate, PRICES) });
      expect(streamed).toMatchObject({ ...streamedEstimate, cost: costOf(streamedEstimate, PRICES) });
      expect(buffered.cost).toBeGreaterThan(0n);
      expect(streamed.cost).toBeGreaterThan(0n);
      // A valid input count with an output that is not one: the exact input, a token per chunk.
      const { streamed: counted } = await charged(provider({ input_tokens: 10, output_tokens: 1 }));
      expect(counted).toMatchObject({ ...usage(10, 3, 0), cost: costOf(usage(10, 3, 0), PRICES) });
    });
  });

  it("refuses an unknown model without calling the upstream or publishing", async () => {
    const { provider, publisher, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const err = await rejection(inference.complete(input({ model: "nope" }), new AbortController().signal));
    expect(err).toBeInstanceOf(InferenceError);
    expect((err as InferenceError).code).toBe("model_not_found");
    expect(provider.requests).toHaveLength(0);
    expect(publisher.events).toHaveLength(0);
  });

  describe("embeddings", () => {
    const embedInput = (overrides: Partial<CompletionInput> = {}) =>
      input({
        operation: "embeddings",
        model: "public-embed",
        body: { model: "public-embed", input: ["alpha", "beta"], max_tokens: 9, stream: false },
        ...overrides,
      });
    const embedResult = (u: TokenCounts | undefined): ProviderResult => ({
      // Out of order, with an extra field: the caller gets input order and OpenAI's shape.
      json: {
        object: "list",
        data: [
          { object: "embedding", index: 1, embedding: "AACAPw==" },
          { object: "embedding", index: 0, embedding: [0.6, 0.8], extra: true },
        ],
        model: "x",
        usage: { prompt_tokens: 99 },
      },
      usage: u,
    });

    it("forwards to the upstream's embeddings with no output cap, bills input tokens only, with the operation", async () => {
      const { provider, publisher, inference } = setup({ result: embedResult(usage(7, 3)) });
      const { json, usage: billed } = await inference.complete(embedInput(), new AbortController().signal);
      expect(provider.requests[0]).toEqual({
        operation: "embeddings",
        body: { model: "org/embed", input: ["alpha", "beta"] },
      });
      expect(json).toEqual({
        object: "list",
        data: [
          { object: "embedding", index: 0, embedding: [0.6, 0.8] },
          { object: "embedding", index: 1, embedding: "AACAPw==" },
        ],
        model: "public-embed",
        usage: { prompt_tokens: 7, total_tokens: 7 },
      });
      expect(billed).toMatchObject({
        inputTokens: 7,
        outputTokens: 0,
        cost: costOf(usage(7, 0), EMBEDDER.pricing),
      });
      expect(publisher.events).toHaveLength(1);
      expect(publisher.events[0]).toMatchObject({
        model: "public-embed",
        operation: "embeddings",
        tokens: usage(7, 0),
        cost: billed.cost,
      });
    });

    it("charges at most the quote when the upstream reports more input than the quote bounds", async () => {
      const overs: unknown[] = [];
      const provider = new FakeProvider({ result: embedResult(usage(1_000_000, 0)) });
      const publisher = new MemoryPublisher();
      const inference = new Inference(
        new Catalog([EMBEDDER], new Map([["up-1", provider]])),
        publisher,
        SNAPSHOT,
        () => "evt_1",
        (o) => overs.push(o),
      );
      const { usage: billed } = await inference.complete(
        embedInput({ billing: { ...BILLING, quote: 5n } }),
        new AbortController().signal,
      );
      expect(billed.cost).toBe(5n);
      expect(publisher.events[0]?.cost).toBe(5n);
      expect(overs).toHaveLength(1);
    });

    it("bills nothing when the upstream's answer holds no embeddings", async () => {
      const { publisher, inference } = setup({ result: { json: { object: "list" }, usage: usage(3, 0) } });
      const err = await rejection(inference.complete(embedInput(), new AbortController().signal));
      expect((err as InferenceError).code).toBe("upstream_error");
      expect(publisher.events).toHaveLength(0);
    });

    it("estimates the input when the upstream reports no usage", async () => {
      const { inference } = setup({ result: embedResult(undefined) });
      const { usage: billed } = await inference.complete(
        embedInput({ body: { model: "public-embed", input: ["abcdefgh", [1, 2, 3]] } }),
        new AbortController().signal,
      );
      expect(billed).toMatchObject({ inputTokens: 5, outputTokens: 0 });
    });

    it("refuses a chat model for embeddings and an embedding model for chat, before any upstream call", async () => {
      const { provider, publisher, inference } = setup({ result: embedResult(usage(1, 0)) });
      const wrong = await rejection(
        inference.complete(embedInput({ model: "public-small" }), new AbortController().signal),
      );
      expect((wrong as InferenceError).code).toBe("model_kind_mismatch");
      expect((wrong as InferenceError).message).toContain("public-small");
      const chat = await rejection(
        inference.complete(input({ model: "public-embed" }), new AbortController().signal),
      );
      expect((chat as InferenceError).code).toBe("model_kind_mismatch");
      const streamed = await rejection(
        (async () => {
          for await (const _ of inference.stream(
            input({ model: "public-embed" }),
            false,
            new AbortController().signal,
          ));
        })(),
      );
      expect((streamed as InferenceError).code).toBe("model_kind_mismatch");
      expect(provider.requests).toHaveLength(0);
      expect(publisher.events).toHaveLength(0);
    });
  });

  it("refuses a model that cannot reason when the route needs reasoning, before any upstream call", async () => {
    const { provider, publisher, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    const err = await rejection(
      inference.complete(input({ requireReasoning: true }), new AbortController().signal),
    );
    expect((err as InferenceError).code).toBe("model_cannot_reason");
    expect((err as InferenceError).message).toContain("public-small");
    expect(provider.requests).toHaveLength(0);
    expect(publisher.events).toHaveLength(0);
  });

  it("serves a reasoning model when the route needs reasoning", async () => {
    const { provider, inference } = setup({ result: chatResult("x", usage(1, 5, 4)) });
    const { usage: u } = await inference.complete(
      input({ model: "public-reasoner", requireReasoning: true }),
      new AbortController().signal,
    );
    expect(provider.requests[0]?.body.model).toBe("org/r1");
    expect(u.reasoningTokens).toBe(4);
  });

  it("publishes nothing when the upstream fails", async () => {
    const failure = new InferenceError("upstream_error", "the upstream answered 500");
    const { publisher, inference } = setup({ error: failure });
    await expect(inference.complete(input(), new AbortController().signal)).rejects.toBe(failure);
    expect(publisher.events).toHaveLength(0);
  });

  it("fails with usage_not_recorded when the usage event cannot be published", async () => {
    const { publisher, inference } = setup({ result: chatResult("x", usage(1, 1)) });
    publisher.failing = true;
    const err = await rejection(inference.complete(input(), new AbortController().signal));
    expect(err).toBeInstanceOf(InferenceError);
    expect((err as InferenceError).code).toBe("usage_not_recorded");
  });
});

describe("Inference.stream", () => {
  it("always asks the upstream for usage, continuous on vLLM, keeping the caller's other stream options", async () => {
    const { provider, inference } = setup({ chunks: fullStream(usage(5, 3)) });
    const body = {
      model: "public-small",
      messages: [{ role: "user", content: "hi" }],
      stream_options: { include_usage: false, other: 1 },
    };
    await drain(inference.stream(input({ body }), false, new AbortController().signal));

    expect(provider.requests[0]!.body).toEqual({
      model: "org/small-7b",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 64,
      stream: true,
      stream_options: { include_usage: true, other: 1, continuous_usage_stats: true },
    });
  });

  it("bills a stream cut short with the upstream's continuous count of its input", async () => {
    const counted = (completion: number) => ({
      prompt_tokens: 9,
      completion_tokens: completion,
      total_tokens: 9 + completion,
    });
    const chunks = [1, 2, 3, 4].map((n) => ({
      json: { choices: [{ index: 0, delta: { content: "w" } }], usage: counted(n) },
      usage: usage(9, n),
    }));
    const { publisher, inference } = setup({ chunks });
    const received: StreamEvent[] = [];
    for await (const event of inference.stream(input(), true, new AbortController().signal)) {
      received.push(event);
      if (received.length === 2) break;
    }
    expect(publisher.events[0]).toMatchObject({ outcome: "client_cancelled", tokens: usage(9, 2) });
    // The caller sees usage in the usage chunk only, never on content chunks.
    for (const e of received) if ("chunk" in e) expect(e.chunk).not.toHaveProperty("usage");
  });

  it("without includeUsage hides the usage-only chunk but ends with the usage and records one event", async () => {
    const { publisher, inference } = setup({ chunks: fullStream(usage(40, 3, 1)) });
    const events = await drain(inference.stream(input(), false, new AbortController().signal));

    const chunks = chunksOf(events);
    expect(chunks).toHaveLength(5);
    for (const c of chunks) {
      expect(c.model).toBe("public-small");
      expect(c.choices).not.toEqual([]);
      expect(c).not.toHaveProperty("usage");
    }
    const last = events.at(-1)!;
    const cost = costOf(usage(40, 3), PRICES);
    expect(last).toEqual({
      usage: { ...usage(40, 3, 1), cost, pricingSnapshotId: SNAPSHOT, eventId: "evt_1" },
    });
    expect(usagesOf(events)).toHaveLength(1);

    expect(publisher.events).toHaveLength(1);
    expect(publisher.events[0]).toMatchObject({
      outcome: "completed",
      streamed: true,
      tokens: usage(40, 3, 1),
      cost,
      model: "public-small",
      requestId: "req_1",
      ...BILLING,
    });
  });

  it("with includeUsage passes the usage chunk on before the final usage", async () => {
    const { publisher, inference } = setup({ chunks: fullStream(usage(40, 3)) });
    const events = await drain(inference.stream(input(), true, new AbortController().signal));

    const chunks = chunksOf(events);
    expect(chunks).toHaveLength(6);
    expect(chunks[5]).toMatchObject({
      model: "public-small",
      choices: [],
      usage: { prompt_tokens: 40, completion_tokens: 3 },
    });
    expect(events.at(-1)).toHaveProperty("usage");
    expect(publisher.events).toHaveLength(1);
  });

  it("removes per-chunk usage from content chunks when the caller did not ask for usage", async () => {
    const withStats: ProviderChunk = {
      json: { choices: [{ index: 0, delta: { content: "a" } }], usage: { prompt_tokens: 1 } },
      usage: usage(1, 1),
    };
    const { inference } = setup({ chunks: [withStats, usageChunk(usage(1, 1))] });
    const hidden = chunksOf(await drain(inference.stream(input(), false, new AbortController().signal)));
    expect(hidden).toHaveLength(1);
    expect(hidden[0]).not.toHaveProperty("usage");
  });

  it("counts one token per text chunk when the upstream reports no usage", async () => {
    const chunks = [
      roleChunk(),
      textChunk("a"),
      textChunk("b"),
      textChunk("c"),
      textChunk("d"),
      finishChunk(),
    ];
    const { publisher, inference } = setup({ chunks });
    const events = await drain(inference.stream(input(), false, new AbortController().signal));

    expect(usagesOf(events)[0]).toMatchObject(usage(4, 4, 0));
    expect(publisher.events.map((e) => e.tokens)).toEqual([usage(4, 4, 0)]);
  });

  it("sends with every chunk the usage so far, under the one event id the stream is published with", async () => {
    const chunks = [roleChunk(), textChunk("a"), textChunk("b"), finishChunk()];
    const { publisher, inference } = setup({ chunks });
    const events = await drain(inference.stream(input(), false, new AbortController().signal));

    const soFar = events.flatMap((e) => ("soFar" in e ? [e.soFar] : []));
    expect(soFar.map((e) => e.tokens.outputTokens)).toEqual([0, 1, 2, 2]);
    for (const e of soFar) {
      expect(e).toMatchObject({ outcome: "upstream_failed", streamed: true, reservationId: "res_1" });
      expect(e.cost).toBe(costOf(e.tokens, PRICES));
    }
    expect(publisher.events).toHaveLength(1);
    expect(new Set([...soFar.map((e) => e.eventId), publisher.events[0]!.eventId]).size).toBe(1);
  });

  it("reads the prompt once per stream, not at every chunk, and reuses the usage so far while it holds", async () => {
    const chunks = [roleChunk(), ...Array.from({ length: 50 }, () => textChunk("x")), finishChunk()];
    const { publisher, inference } = setup({ chunks });
    let reads = 0;
    const messages = [{ role: "user", content: "Say something long ".repeat(200) }];
    const body: Record<string, unknown> = { model: "public-small" };
    Object.defineProperty(body, "messages", {
      enumerable: true,
      get: () => {
        reads++;
        return messages;
      },
    });
    const events = await drain(inference.stream(input({ body }), false, new AbortController().signal));

    // To build the upstream body and to estimate the prompt: a few reads, none per chunk.
    expect(reads).toBeLessThanOrEqual(3);
    const soFar = events.flatMap((e) => ("soFar" in e ? [e.soFar] : []));
    expect(soFar).toHaveLength(52);
    // The role chunk and the finish chunk count no token: they carry the previous usage as is.
    expect(soFar[51]).toBe(soFar[50]);
    expect(soFar[50]!.tokens).toEqual(usage(Math.ceil(messages[0]!.content.length / 4), 50, 0));
    expect(publisher.events.map((e) => e.tokens)).toEqual([soFar[50]!.tokens]);
  });

  it("records one client_cancelled event when the consumer stops after two chunks", async () => {
    const chunks = [textChunk("a"), textChunk("b"), textChunk("c"), textChunk("d"), usageChunk(usage(9, 4))];
    const { provider, publisher, inference } = setup({ chunks });
    const received: StreamEvent[] = [];
    for await (const event of inference.stream(input(), false, new AbortController().signal)) {
      received.push(event);
      if (received.length === 2) break;
    }

    expect(received).toHaveLength(2);
    expect(provider.streamClosed).toBe(true);
    expect(publisher.events).toHaveLength(1);
    const tokens = usage(4, 2, 0);
    expect(publisher.events[0]).toMatchObject({
      outcome: "client_cancelled",
      streamed: true,
      tokens,
      cost: costOf(tokens, PRICES),
    });
  });

  it("records client_cancelled and ends quietly when the signal aborts mid-stream", async () => {
    const chunks = [roleChunk(), textChunk("a"), textChunk("b"), textChunk("c"), finishChunk()];
    const { publisher, inference } = setup({ chunks });
    const abort = new AbortController();
    const received: StreamEvent[] = [];
    for await (const event of inference.stream(input(), false, abort.signal)) {
      received.push(event);
      if (received.length === 3) abort.abort();
    }

    expect(received).toHaveLength(3);
    expect(usagesOf(received)).toHaveLength(0);
    expect(publisher.events).toHaveLength(1);
    expect(publisher.events[0]).toMatchObject({ outcome: "client_cancelled", tokens: usage(4, 2, 0) });
  });

  it("records a zero-cost client_cancelled event, under the request's reservation, when the caller of a buffered call goes before the answer", async () => {
    // A request admitted on a lease: api-edge leaves its ticket unsure when its caller goes, and
    // only this event's settlement ends the hold (docs/money.md, "Leases").
    const billing = { ...BILLING, door: "account", reservationId: "lease_1~4", quote: 31n } as const;
    const abort = new AbortController();
    const { publisher, inference } = setup({ error: new Error("the upstream call was aborted") });
    abort.abort();
    await expect(inference.complete(input({ billing }), abort.signal)).rejects.toThrow("aborted");
    expect(publisher.events).toHaveLength(1);
    expect(publisher.events[0]).toMatchObject({
      outcome: "client_cancelled",
      streamed: false,
      reservationId: "lease_1~4",
      tokens: usage(0, 0, 0),
      cost: 0n,
    });
    // A failure with the caller still there records nothing: api-edge gives the hold back.
    const failed = setup({ error: new Error("upstream down") });
    await expect(
      failed.inference.complete(input({ billing }), new AbortController().signal),
    ).rejects.toThrow();
    expect(failed.publisher.events).toEqual([]);
  });

  it("records a zero-cost client_cancelled event, under the stream's reservation, when the caller goes before the upstream's first chunk", async () => {
    // A request admitted on a lease: api-edge leaves its ticket unsure when its caller goes, and
    // only this event's settlement ends the hold (docs/money.md, "Leases").
    const billing = { ...BILLING, door: "account", reservationId: "lease_1~3", quote: 31n } as const;
    for (const reservationId of [billing.reservationId, "res_alone"]) {
      const { provider, publisher, inference } = setup({
        chunks: [roleChunk(), textChunk("a"), finishChunk()],
      });
      const abort = new AbortController();
      // The caller is gone while the upstream has not sent its first chunk yet.
      abort.abort();
      const received = await drain(
        inference.stream(input({ billing: { ...billing, reservationId } }), true, abort.signal),
      );

      expect(provider.requests).toHaveLength(1);
      expect(received).toEqual([]);
      expect(publisher.events).toHaveLength(1);
      expect(publisher.events[0]).toMatchObject({
        eventId: "evt_1",
        outcome: "client_cancelled",
        streamed: true,
        reservationId,
        tokens: usage(0, 0, 0),
        cost: 0n,
      });
    }
  });

  it("records one upstream_failed event and rethrows when the upstream fails mid-stream", async () => {
    const failure = new InferenceError("upstream_error", "the upstream failed mid-stream");
    const chunks = [roleChunk(), textChunk("a"), textChunk("b"), textChunk("c"), finishChunk()];
    const { publisher, inference } = setup({ chunks, error: failure, throwAfter: 3 });
    const { received, err } = await eventsUntilFailure(
      inference.stream(input(), false, new AbortController().signal),
    );

    expect(err).toBe(failure);
    expect(received).toHaveLength(3);
    expect(publisher.events).toHaveLength(1);
    const tokens = usage(4, 2, 0);
    expect(publisher.events[0]).toMatchObject({
      outcome: "upstream_failed",
      streamed: true,
      tokens,
      cost: costOf(tokens, PRICES),
    });
  });

  it("bills an upstream failure exactly the usage so far of the last chunk relayed, not a usage chunk the caller never got", async () => {
    const failure = new InferenceError("upstream_error", "the upstream failed mid-stream");
    // The upstream's usage chunk comes (not relayed: the caller did not ask for usage), then it
    // fails before its end: the relay holds, records and tells the usage so far of "b".
    const chunks = [textChunk("a"), textChunk("b"), usageChunk(usage(9, 7)), finishChunk()];
    const { publisher, inference } = setup({ chunks, error: failure, throwAfter: 3 });
    const { received, err } = await eventsUntilFailure(
      inference.stream(input(), false, new AbortController().signal),
    );

    expect(err).toBe(failure);
    const soFar = received.flatMap((e) => ("soFar" in e ? [e.soFar] : []));
    expect(soFar).toHaveLength(2);
    expect(publisher.events).toHaveLength(1);
    expect(publisher.events[0]).toMatchObject({
      eventId: soFar[1]!.eventId,
      outcome: "upstream_failed",
      tokens: soFar[1]!.tokens,
      cost: soFar[1]!.cost,
    });
  });

  it("publishes nothing when the upstream fails after chunks the caller was never relayed", async () => {
    const failure = new InferenceError("upstream_error", "the upstream failed mid-stream");
    const { publisher, inference } = setup({
      chunks: [usageChunk(usage(9, 0)), textChunk("a")],
      error: failure,
      throwAfter: 1,
    });
    await expect(drain(inference.stream(input(), false, new AbortController().signal))).rejects.toBe(failure);
    expect(publisher.events).toHaveLength(0);
  });

  it("publishes nothing and rethrows when the upstream fails before any chunk", async () => {
    const failure = new InferenceError("upstream_rejected", "context too long");
    const { publisher, inference } = setup({ chunks: [textChunk("a")], error: failure, throwAfter: 0 });
    await expect(drain(inference.stream(input(), false, new AbortController().signal))).rejects.toBe(failure);
    expect(publisher.events).toHaveLength(0);
  });

  it("refuses an unknown model without calling the upstream", async () => {
    const { provider, publisher, inference } = setup({ chunks: fullStream(usage(1, 1)) });
    const err = await rejection(
      drain(inference.stream(input({ model: "nope" }), false, new AbortController().signal)),
    );
    expect((err as InferenceError).code).toBe("model_not_found");
    expect(provider.requests).toHaveLength(0);
    expect(publisher.events).toHaveLength(0);
  });

  it("refuses a model that cannot reason when the route needs reasoning, before any upstream call", async () => {
    const { provider, publisher, inference } = setup({ chunks: fullStream(usage(1, 1)) });
    const err = await rejection(
      drain(inference.stream(input({ requireReasoning: true }), false, new AbortController().signal)),
    );
    expect((err as InferenceError).code).toBe("model_cannot_reason");
    expect(provider.requests).toHaveLength(0);
    expect(publisher.events).toHaveLength(0);
  });

  it("fails with usage_not_recorded instead of ending with usage when publishing fails", async () => {
    const { publisher, inference } = setup({ chunks: fullStream(usage(5, 3)) });
    publisher.failing = true;
    const { received, err } = await eventsUntilFailure(
      inference.stream(input(), false, new AbortController().signal),
    );
    expect(err).toBeInstanceOf(InferenceError);
    expect((err as InferenceError).code).toBe("usage_not_recorded");
    expect(usagesOf(received)).toHaveLength(0);
  });
});
