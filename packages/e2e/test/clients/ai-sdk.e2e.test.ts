import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import {
  APICallError,
  generateObject,
  generateText,
  jsonSchema,
  type LanguageModel,
  streamText,
  tool,
} from "ai";
import { describe, expect, it } from "vitest";
import {
  KEYS,
  MODEL,
  REFUSALS,
  type Refusal,
  ROUTE_REFUSAL,
  rejection,
  UPSTREAM_OUTPUT_TOKENS,
  useClientGateway,
} from "./fixture.js";

/**
 * Vercel's AI SDK (`ai`'s generateText and streamText), with its two providers for an
 * OpenAI-compatible server, each configured as its docs show (`baseURL` at the gateway's /v1,
 * the Virtual Key as `apiKey`): `@ai-sdk/openai`'s default model (`openai(modelId)`, which calls
 * the Responses API) and `@ai-sdk/openai-compatible`'s chat model (chat completions, with
 * `includeUsage` so a stream reports its usage). Buffered and streamed text (and on the Responses
 * model `generateObject`, and tools refused there but served by `.chat(model)`), usage as the SDK's
 * own `usage` reports it, and refusals as its users see them: the SDK maps every HTTP error to
 * `APICallError` with `statusCode` (no class per status), and a stream's error reaches `onError`
 * and the `error` part of `fullStream` rather than a throw. The books of every account used are
 * checked after each case.
 */
describe("Vercel AI SDK against the account door", () => {
  const gateway = useClientGateway();

  const providers: {
    name: string;
    /**
     * The provider options of the conversation below: @ai-sdk/openai's Responses model stores
     * answers by default and sends an earlier answer back as a reference to the stored item (the
     * gateway keeps its answers' output messages for that, see "storing left on" below); here
     * storing is off, so the earlier answer goes back as text.
     */
    conversation: Record<string, { store: boolean }>;
    path: "/v1/responses" | "/v1/chat/completions";
    model: (key: string, modelId?: string) => LanguageModel;
  }[] = [
    {
      name: "@ai-sdk/openai, default model (Responses API)",
      path: "/v1/responses",
      conversation: { openai: { store: false } },
      model: (key, modelId = MODEL) =>
        createOpenAI({ baseURL: `${gateway().url}/v1`, apiKey: key, fetch: gateway().wire.fetch })(modelId),
    },
    {
      name: "@ai-sdk/openai-compatible (chat completions)",
      path: "/v1/chat/completions",
      conversation: {},
      model: (key, modelId = MODEL) =>
        createOpenAICompatible({
          name: "tollgate",
          baseURL: `${gateway().url}/v1`,
          apiKey: key,
          includeUsage: true,
          fetch: gateway().wire.fetch,
        }).chatModel(modelId),
    },
  ];

  describe.each(providers)("$name", ({ path, conversation, model }) => {
    it("generateText: the text, its usage, finish reason and cost", async () => {
      const result = await generateText({
        model: model(KEYS.served),
        system: "Be brief.",
        prompt: "Say something",
        maxOutputTokens: 9,
        maxRetries: 0,
      });
      expect(result.text.trim().split(" ")).toHaveLength(9);
      expect(result.finishReason).toBe("length");
      expect(result.usage.outputTokens).toBe(9);
      expect(result.usage.inputTokens).toBeGreaterThan(0);
      expect(result.usage.totalTokens).toBe((result.usage.inputTokens ?? 0) + 9);
      expect(result.response.modelId).toBe(MODEL);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      // The cost as the SDK's users read it: the response's headers.
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
      expect(result.response.headers?.["x-tollgate-cost"]).toBe(String(gateway().wire.last().cost));
    });

    it("streamText: the text as it comes, then its usage, finish reason and cost", async () => {
      const errors: unknown[] = [];
      const result = streamText({
        model: model(KEYS.served),
        prompt: "Say something",
        maxRetries: 0,
        includeRawChunks: true,
        onError: ({ error }) => {
          errors.push(error);
        },
      });
      const parts: string[] = [];
      let told: string | undefined;
      for await (const part of result.fullStream) {
        if (part.type === "text-delta") parts.push(part.text);
        // The cost as the SDK's users read it: the raw usage event's `x_tollgate`.
        if (part.type === "raw")
          told ??= (part.rawValue as { x_tollgate?: { cost: string } }).x_tollgate?.cost;
      }
      expect(parts.length).toBeGreaterThan(1);
      // The upstream's whole answer is under the connection's default cap.
      expect(parts.join("").trim().split(" ")).toHaveLength(UPSTREAM_OUTPUT_TOKENS);
      expect(await result.finishReason).toBe("stop");
      const usage = await result.usage;
      expect(usage.outputTokens).toBe(UPSTREAM_OUTPUT_TOKENS);
      expect(usage.inputTokens).toBeGreaterThan(0);
      expect(errors).toEqual([]);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
      expect(told).toBe(String(gateway().wire.last().cost));
    });

    /** Two turns: a first answer, then the conversation so far with it, as the SDK's docs show. */
    async function converse(providerOptions?: Record<string, { store: boolean }>) {
      const settings = { model: model(KEYS.served), maxOutputTokens: 4, maxRetries: 0, providerOptions };
      const first = await generateText({ ...settings, prompt: "Hello" });
      const second = generateText({
        ...settings,
        messages: [
          { role: "user", content: "Hello" },
          ...first.response.messages,
          { role: "user", content: "Again" },
        ],
      });
      return { first, second };
    }

    it("a conversation: the earlier turns, the model's own answer included, go back as input", async () => {
      const { first, second: answered } = await converse(conversation);
      const second = await answered;
      expect(second.text.trim().split(" ")).toHaveLength(4);
      // The second request carried the first answer's text: three messages' worth of input.
      expect(second.usage.inputTokens).toBeGreaterThan(first.usage.inputTokens ?? 0);
      expect(JSON.stringify(gateway().upstream.requests.at(-1)?.body)).toContain(first.text.trim());
    });

    if (path === "/v1/responses") {
      it("a conversation with storing left on (the default): the earlier answer goes back by reference and is answered", async () => {
        const { first, second: answered } = await converse();
        const second = await answered;
        expect(second.text.trim().split(" ")).toHaveLength(4);
        // The SDK sent the first answer as a reference to the item the gateway kept, not its text.
        const sent = second.request.body as { input: unknown[] };
        expect(sent.input).toContainEqual({ type: "item_reference", id: expect.stringMatching(/^msg_/) });
        expect(JSON.stringify(sent)).not.toContain(first.text.trim());
        // The model got the answer's text back in its place, and the input counted it.
        expect(JSON.stringify(gateway().upstream.requests.at(-1)?.body)).toContain(first.text.trim());
        expect(second.usage.inputTokens).toBeGreaterThan(first.usage.inputTokens ?? 0);
        expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
        expect(second.response.headers?.["x-tollgate-cost"]).toBe(String(gateway().wire.last().cost));
      });
    }

    if (path === "/v1/responses") {
      it("generateObject: the object the schema asked for (text.format json_schema), its usage and cost", async () => {
        const schema = jsonSchema<{ city: string; population: number; coastal: boolean }>({
          type: "object",
          properties: {
            city: { type: "string" },
            population: { type: "number" },
            coastal: { type: "boolean" },
          },
          required: ["city", "population", "coastal"],
          additionalProperties: false,
        });
        const result = await generateObject({
          model: model(KEYS.served),
          schema,
          prompt: "Name a place",
          maxRetries: 0,
        });
        expect(result.object).toEqual({
          city: expect.stringMatching(/^[a-z]+$/),
          population: 0,
          coastal: false,
        });
        const sent = result.request.body as { text?: { format?: { type?: string } } };
        expect(sent.text?.format?.type).toBe("json_schema");
        expect(gateway().upstream.requests.at(-1)?.body).toMatchObject({
          response_format: { type: "json_schema" },
        });
        expect(result.finishReason).toBe("stop");
        // Counted as any answer: one output token per four characters of the JSON.
        expect(result.usage.outputTokens).toBe(Math.ceil(JSON.stringify(result.object).length / 4));
        expect(result.usage.inputTokens).toBeGreaterThan(0);
        expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
        expect(result.response.headers?.["x-tollgate-cost"]).toBe(String(gateway().wire.last().cost));
      });

      it("tools are refused on the Responses model (400) and served on the chat model, openai.chat(model)", async () => {
        const tools = {
          lookup: tool({
            inputSchema: jsonSchema<{ q: string }>({
              type: "object",
              properties: { q: { type: "string" } },
              required: ["q"],
            }),
          }),
        };
        const provider = createOpenAI({
          baseURL: `${gateway().url}/v1`,
          apiKey: KEYS.served,
          fetch: gateway().wire.fetch,
        });
        const err = await rejection(
          generateText({ model: provider(MODEL), tools, prompt: "hi", maxRetries: 0 }),
        );
        expect(err).toBeInstanceOf(APICallError);
        expect((err as APICallError).statusCode).toBe(400);
        expect((err as APICallError).responseBody).toContain("tools");
        const chat = await generateText({
          model: provider.chat(MODEL),
          tools,
          prompt: "hi",
          maxOutputTokens: 3,
          maxRetries: 0,
        });
        expect(chat.text.trim().split(" ")).toHaveLength(3);
        expect(gateway().wire.last()).toMatchObject({ path: "/v1/chat/completions", status: 200 });
      });
    }

    /** The error generateText raises for `refusal`: APICallError with its status and our code. */
    async function expectRefused(refusal: Refusal) {
      const err = await rejection(
        generateText({ model: model(refusal.key, refusal.model), prompt: "hi", maxRetries: 0 }),
      );
      expect(err).toBeInstanceOf(APICallError);
      const call = err as APICallError;
      expect(call.statusCode).toBe(refusal.status);
      expect(JSON.parse(call.responseBody ?? "{}")).toMatchObject({ error: { code: refusal.code } });
      // The SDK would retry a 429 (and 5xx) by itself unless told not to; the rest never.
      expect(call.isRetryable).toBe(refusal.status === 429);
      return call;
    }

    it("generateText raises APICallError with the status for 401, 402, 403 and 429", async () => {
      await gateway().fillRateLimit();
      for (const refusal of Object.values(REFUSALS)) await expectRefused(refusal);
      if (path === "/v1/responses") await expectRefused(ROUTE_REFUSAL);
    });

    it("streamText hands a refusal to onError and fullStream's error part, with no text", async () => {
      await gateway().fillRateLimit();
      const seen: unknown[] = [];
      const result = streamText({
        model: model(REFUSALS.rateLimit.key),
        prompt: "hi",
        maxRetries: 0,
        onError: ({ error }) => {
          seen.push(error);
        },
      });
      const types: string[] = [];
      let streamed: unknown;
      for await (const part of result.fullStream) {
        types.push(part.type);
        if (part.type === "error") streamed = part.error;
      }
      expect(types).not.toContain("text-delta");
      expect(streamed).toBeInstanceOf(APICallError);
      expect((streamed as APICallError).statusCode).toBe(429);
      expect(seen).toEqual([streamed]);
    });
  });
});
