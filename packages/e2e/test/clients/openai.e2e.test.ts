import OpenAI from "openai";
import { describe, expect, it } from "vitest";
import {
  EMBED_MODEL,
  expectOpenAIError,
  KEYS,
  MODEL,
  REFUSALS,
  type Refusal,
  ROUTE_REFUSAL,
  rejection,
  UPSTREAM_OUTPUT_TOKENS,
  useClientGateway,
} from "./fixture.js";

/** The `x_tollgate` extension the gateway puts on a stream's usage event. */
type XTollgate = { cost: string; budget_remaining: string };

/**
 * The official openai SDK, configured as its users do (`baseURL` at the gateway's /v1, the
 * Virtual Key as `apiKey`, retries off so a refusal is seen once), on every route it calls:
 * chat completions, legacy completions and Responses, buffered and streamed (the Responses
 * events in order, and streams cut either way billed as chat streams are; structured output with
 * `text.format`, and its refusals), embeddings and models;
 * usage as the SDK's own objects report it; refusals as the SDK's own error classes. The books of
 * every account used are checked after each case.
 */
describe("the openai SDK against the account door", () => {
  const gateway = useClientGateway();
  const client = (key: string = KEYS.served) =>
    new OpenAI({ baseURL: `${gateway().url}/v1`, apiKey: key, maxRetries: 0, fetch: gateway().wire.fetch });

  it("lists and retrieves the key's models", async () => {
    const ids: string[] = [];
    for await (const m of client().models.list()) ids.push(m.id);
    expect(ids).toEqual([MODEL, EMBED_MODEL]);
    expect(await client().models.retrieve(MODEL)).toMatchObject({ id: MODEL, object: "model" });
  });

  it("chat.completions.create: buffered text, its usage, and its cost", async () => {
    const { data: res, response } = await client()
      .chat.completions.create({
        model: MODEL,
        max_tokens: 8,
        messages: [{ role: "user", content: "Say something" }],
      })
      .withResponse();
    expect(res.model).toBe(MODEL);
    expect(res.choices[0]?.message.content?.trim().split(" ")).toHaveLength(8);
    expect(res.choices[0]?.finish_reason).toBe("length");
    expect(res.usage?.completion_tokens).toBe(8);
    expect(res.usage?.prompt_tokens).toBeGreaterThan(0);
    expect(res.usage?.total_tokens).toBe((res.usage?.prompt_tokens ?? 0) + 8);
    expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    expect(response.headers.get("x-tollgate-cost")).toBe(String(gateway().wire.last().cost));
  });

  it("chat.completions.create({ stream: true }): the text in chunks, usage and cost last", async () => {
    const stream = await client().chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Say something" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage: OpenAI.CompletionUsage | null | undefined;
    let finish: string | null | undefined;
    let told: string | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      finish ??= chunk.choices[0]?.finish_reason;
      if (chunk.usage) {
        usage = chunk.usage;
        told = (chunk as unknown as { x_tollgate: { cost: string } }).x_tollgate.cost;
      }
    }
    // The upstream's whole answer is under the connection's default cap.
    expect(text.trim().split(" ")).toHaveLength(UPSTREAM_OUTPUT_TOKENS);
    expect(finish).toBe("stop");
    expect(usage?.completion_tokens).toBe(UPSTREAM_OUTPUT_TOKENS);
    expect(usage?.prompt_tokens).toBeGreaterThan(0);
    expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    expect(told).toBe(String(gateway().wire.last().cost));
  });

  it("chat.completions.stream(): the SDK assembles the final completion", async () => {
    const stream = client().chat.completions.stream({
      model: MODEL,
      max_tokens: 5,
      messages: [{ role: "user", content: "Say something" }],
      stream_options: { include_usage: true },
    });
    let deltas = "";
    stream.on("content", (delta) => {
      deltas += delta;
    });
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]?.message.content).toBe(deltas);
    expect(final.choices[0]?.finish_reason).toBe("length");
    expect(final.usage?.completion_tokens).toBe(5);
  });

  it("completions.create: legacy text completion, buffered and streamed", async () => {
    const res = await client().completions.create({ model: MODEL, prompt: "Once upon", max_tokens: 6 });
    expect(res.choices[0]?.text.trim().split(" ")).toHaveLength(6);
    expect(res.usage?.completion_tokens).toBe(6);
    const stream = await client().completions.create({
      model: MODEL,
      prompt: "Once upon",
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? "";
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(res.choices[0]?.text);
    expect(usage?.completion_tokens).toBe(6);
  });

  it("responses.create: buffered output_text and usage", async () => {
    const res = await client().responses.create({
      model: MODEL,
      instructions: "Be brief.",
      input: "Say something",
      max_output_tokens: 10,
    });
    expect(res.status).toBe("incomplete");
    expect(res.incomplete_details?.reason).toBe("max_output_tokens");
    expect(res.output_text.trim().split(" ")).toHaveLength(10);
    expect(res.usage?.output_tokens).toBe(10);
    expect(res.usage?.total_tokens).toBe((res.usage?.input_tokens ?? 0) + 10);
    expect(gateway().wire.last().cost).toBeGreaterThan(0n);
  });

  it("responses.create({ stream: true }): the Responses events in order, the text, usage and cost", async () => {
    const stream = await client().responses.create({
      model: MODEL,
      input: "Say something",
      max_output_tokens: 12,
      stream: true,
    });
    const types: string[] = [];
    const sequence: number[] = [];
    let text = "";
    let final: OpenAI.Responses.Response | undefined;
    let money: XTollgate | undefined;
    for await (const event of stream) {
      types.push(event.type);
      sequence.push(event.sequence_number);
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.completed" || event.type === "response.incomplete") {
        final = event.response;
        money = (event as unknown as { x_tollgate: XTollgate }).x_tollgate;
      }
    }
    expect(types.slice(0, 4)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
    ]);
    expect(types.slice(-4)).toEqual([
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.incomplete",
    ]);
    // One delta per token the upstream produced (it streams one token a chunk).
    expect(types.filter((t) => t === "response.output_text.delta")).toHaveLength(12);
    expect(sequence).toEqual(sequence.map((_, i) => i));
    expect(final?.status).toBe("incomplete");
    expect(final?.incomplete_details?.reason).toBe("max_output_tokens");
    expect(final?.output_text).toBe(text);
    expect(text.length).toBeGreaterThan(0);
    expect(final?.usage?.output_tokens).toBe(12);
    expect(final?.usage?.total_tokens).toBe((final?.usage?.input_tokens ?? 0) + 12);
    expect(money?.cost).toMatch(/^[1-9]\d*$/);
    expect(gateway().wire.last().cost).toBe(BigInt(money!.cost));
  });

  it("responses.stream(): the SDK assembles the final response; a finished answer is completed", async () => {
    const stream = client().responses.stream({
      model: MODEL,
      instructions: "Be brief.",
      input: [{ role: "user", content: [{ type: "input_text", text: "Say something" }] }],
    });
    let deltas = "";
    stream.on("response.output_text.delta", (e) => {
      deltas += e.delta;
    });
    const res = await stream.finalResponse();
    expect(res.status).toBe("completed");
    expect(res.output_text).toBe(deltas);
    // The upstream's whole answer is under the connection's default cap.
    expect(res.usage?.output_tokens).toBe(UPSTREAM_OUTPUT_TOKENS);
    expect(gateway().wire.last().cost).toBeGreaterThan(0n);
  });

  it("ends a Responses stream whose upstream dies mid-way with response.failed, billed for what was produced and told so", async () => {
    gateway().upstream.failNext(1, { afterChunks: 3 });
    const cut = await gateway().cutStream();
    const stream = await client().responses.create({
      model: MODEL,
      input: "Say something",
      max_output_tokens: 30,
      stream: true,
    });
    const types: string[] = [];
    let failed: OpenAI.Responses.Response | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "response.failed") failed = event.response;
    }
    expect(types.filter((t) => t === "response.output_text.delta")).toHaveLength(3);
    expect(types.at(-1)).toBe("response.failed");
    expect(types).not.toContain("response.completed");
    expect(failed?.status).toBe("failed");
    expect(failed?.error?.code).toBe("upstream_error");
    const billed = await cut.billed();
    expect(billed.cost).toBeGreaterThan(0n);
    // response.failed carried the cost (x_tollgate): exactly what metering billed.
    expect(billed.told).toBe(true);
    // The three tokens produced before the cut, as a cut chat stream is billed.
    expect(billed.outputTokens).toBe(3);
  });

  it("bills a Responses stream its caller leaves mid-way for the tokens produced, and leaves no hold", async () => {
    gateway().upstream.configure({ tokensPerSecond: 10 });
    const cut = await gateway().cutStream();
    const stream = await client().responses.create({
      model: MODEL,
      input: "Say something",
      max_output_tokens: 40,
      stream: true,
    });
    let deltas = 0;
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") deltas += 1;
      // Leaving the loop aborts the request: the caller goes away.
      if (deltas === 2) break;
    }
    const billed = await cut.billed();
    expect(billed.cost).toBeGreaterThan(0n);
    expect(billed.outputTokens).toBeGreaterThanOrEqual(2);
    expect(billed.outputTokens).toBeLessThan(40);
  });

  it("responses.create: a conversation, the first response's output items sent back as input", async () => {
    const input: OpenAI.Responses.ResponseInput = [{ role: "user", content: "Hello" }];
    const first = await client().responses.create({ model: MODEL, input, max_output_tokens: 4 });
    const second = await client().responses.create({
      model: MODEL,
      input: [
        ...input,
        ...(first.output as OpenAI.Responses.ResponseInputItem[]),
        { role: "user", content: "Again" },
      ],
      max_output_tokens: 4,
    });
    expect(second.output_text.trim().split(" ")).toHaveLength(4);
    expect(second.usage?.input_tokens).toBeGreaterThan(first.usage?.input_tokens ?? 0);
    expect(JSON.stringify(gateway().upstream.requests.at(-1)?.body)).toContain(first.output_text.trim());
  });

  /** The structured output asked below: what the fake upstream answers is this schema's minimal instance. */
  const PLACE = {
    type: "json_schema",
    name: "place",
    strict: true,
    schema: {
      type: "object",
      properties: {
        city: { type: "string" },
        population: { type: "integer" },
        kind: { type: "string", enum: ["town", "city"] },
      },
      required: ["city", "population", "kind"],
      additionalProperties: false,
    },
  } as const;
  type Place = { city: string; population: number; kind: "town" | "city" };

  it("responses.parse with text.format json_schema: the parsed object, the format and metadata echoed, usage and cost", async () => {
    const { data: res, response } = await client()
      .responses.parse({
        model: MODEL,
        input: "Name a place",
        text: { format: PLACE },
        metadata: { run: "e2e" },
      })
      .withResponse();
    const place = res.output_parsed as Place | null;
    expect(place).toEqual({ city: expect.stringMatching(/^[a-z]+$/), population: 0, kind: "town" });
    expect(res.status).toBe("completed");
    expect(res.text?.format).toEqual(PLACE);
    expect(res.metadata).toEqual({ run: "e2e" });
    // The upstream was asked for it as the chat response_format.
    const { type, ...jsonSchema } = PLACE;
    expect(gateway().upstream.requests.at(-1)?.body).toMatchObject({
      response_format: { type, json_schema: jsonSchema },
    });
    // Counted as any answer: one output token per four characters of the JSON the upstream sent.
    expect(res.usage?.output_tokens).toBe(Math.ceil(res.output_text.length / 4));
    expect(res.usage?.total_tokens).toBe((res.usage?.input_tokens ?? 0) + (res.usage?.output_tokens ?? 0));
    expect(gateway().wire.last()).toMatchObject({ path: "/v1/responses", status: 200 });
    expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    expect(response.headers.get("x-tollgate-cost")).toBe(String(gateway().wire.last().cost));
  });

  it("responses.create({ stream: true }) with text.format json_schema: the JSON in deltas, the format echoed, usage and cost last", async () => {
    const stream = await client().responses.create({
      model: MODEL,
      input: "Name a place",
      text: { format: PLACE },
      stream: true,
    });
    let deltas = "";
    let created: OpenAI.Responses.Response | undefined;
    let final: OpenAI.Responses.Response | undefined;
    let money: XTollgate | undefined;
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") deltas += event.delta;
      if (event.type === "response.created") created = event.response;
      if (event.type === "response.completed") {
        final = event.response;
        money = (event as unknown as { x_tollgate: XTollgate }).x_tollgate;
      }
    }
    expect(JSON.parse(deltas)).toMatchObject({ population: 0, kind: "town" });
    expect(final?.output_text).toBe(deltas);
    expect(created?.text?.format).toEqual(PLACE);
    expect(final?.text?.format).toEqual(PLACE);
    expect(final?.usage?.output_tokens).toBe(Math.ceil(deltas.length / 4));
    expect(money?.cost).toMatch(/^[1-9]\d*$/);
    expect(gateway().wire.last().cost).toBe(BigInt(money!.cost));
  });

  it("responses.create with text.format json_object: a JSON object", async () => {
    const res = await client().responses.create({
      model: MODEL,
      input: "Answer in JSON",
      text: { format: { type: "json_object" } },
    });
    expect(res.text?.format).toEqual({ type: "json_object" });
    expect(JSON.parse(res.output_text)).toEqual({ answer: expect.any(String) });
    expect(res.usage?.output_tokens).toBe(Math.ceil(res.output_text.length / 4));
  });

  it("refuses a text.format the route cannot take and function tools with BadRequestError, nothing billed", async () => {
    const refused = [
      client().responses.create({
        model: MODEL,
        input: "hi",
        text: { format: { type: "json_schema", name: "no spaces allowed", schema: {} } },
      }),
      client().responses.create({
        model: MODEL,
        input: "hi",
        tools: [{ type: "function", name: "f", parameters: {}, strict: true }],
      }),
    ];
    const [format, tools] = await Promise.all(refused.map(rejection));
    for (const err of [format, tools]) {
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("invalid_request");
    }
    expect((format as Error).message).toContain("text.format.name");
    expect((tools as Error).message).toContain("tools");
  });

  it("embeddings.create: one vector per input, and usage", async () => {
    const res = await client().embeddings.create({ model: EMBED_MODEL, input: ["alpha", "beta"] });
    expect(res.data.map((d) => d.index)).toEqual([0, 1]);
    expect(res.data[0]?.embedding.length).toBeGreaterThan(0);
    expect(res.usage.prompt_tokens).toBeGreaterThan(0);
    expect(gateway().wire.last().cost).toBeGreaterThan(0n);
  });

  /** The SDK's error for `refusal`, the class it raises for that status, and its code. */
  async function expectRefused(call: (sdk: OpenAI) => Promise<unknown>, refusal: Refusal) {
    const err = await rejection(call(client(refusal.key)));
    const apiError = expectOpenAIError(err, refusal);
    expect(apiError.requestID).toMatch(/.+/);
    return apiError;
  }

  it("raises the SDK's own error classes for 401, 402, 403 and 429 on chat, streamed chat and Responses", async () => {
    await gateway().fillRateLimit();
    for (const refusal of Object.values(REFUSALS)) {
      const params = { model: refusal.model, messages: [{ role: "user" as const, content: "hi" }] };
      await expectRefused((sdk) => sdk.chat.completions.create(params), refusal);
      await expectRefused((sdk) => sdk.chat.completions.create({ ...params, stream: true }), refusal);
      await expectRefused((sdk) => sdk.responses.create({ model: refusal.model, input: "hi" }), refusal);
    }
    const limited = await expectRefused(
      (sdk) => sdk.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }] }),
      REFUSALS.rateLimit,
    );
    expect(Number(limited.headers?.get("retry-after"))).toBeGreaterThan(0);
  });

  it("raises PermissionDeniedError for a route the key's connection does not allow", async () => {
    await expectRefused((sdk) => sdk.responses.create({ model: MODEL, input: "hi" }), ROUTE_REFUSAL);
    await expectRefused((sdk) => sdk.embeddings.create({ model: MODEL, input: "hi" }), ROUTE_REFUSAL);
    // The same key is served on the route it may use.
    const res = await client(KEYS.chatOnly).chat.completions.create({
      model: MODEL,
      max_tokens: 3,
      messages: [{ role: "user", content: "hi" }],
    });
    expect(res.usage?.completion_tokens).toBe(3);
  });
});
