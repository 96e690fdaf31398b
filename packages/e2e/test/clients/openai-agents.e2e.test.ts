import { Agent, OpenAIProvider, Runner, setTracingDisabled } from "@openai/agents";
import OpenAI from "openai";
import { describe, expect, it } from "vitest";
import {
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

// Tracing would export every run to OpenAI's tracing endpoint: off for the whole process.
setTracingDisabled(true);

/**
 * The OpenAI Agents SDK (`@openai/agents`), pointed at the gateway as its docs show for another
 * OpenAI-compatible endpoint: an `OpenAIProvider` around an openai client (`baseURL` at the
 * gateway's /v1, the Virtual Key as `apiKey`) given to a `Runner`, with tracing off. By default
 * (`useResponses`) it calls the Responses API; `useResponses: false` calls chat completions. An
 * agent's run, buffered and streamed, an agent's structured `outputType`, its usage as the run
 * context's own `usage` reports it, and refusals as its users see them: the run rejects with the
 * openai SDK's own error classes.
 * The books of every account used are checked after each case.
 */
describe("OpenAI Agents SDK against the account door", () => {
  const gateway = useClientGateway();

  const modes = [
    { name: "default (Responses API)", path: "/v1/responses", useResponses: true },
    { name: "useResponses: false (chat completions)", path: "/v1/chat/completions", useResponses: false },
  ];

  describe.each(modes)("$name", ({ path, useResponses }) => {
    const runner = (key: string = KEYS.served) =>
      new Runner({
        modelProvider: new OpenAIProvider({
          openAIClient: new OpenAI({
            baseURL: `${gateway().url}/v1`,
            apiKey: key,
            maxRetries: 0,
            fetch: gateway().wire.fetch,
          }),
          useResponses,
        }),
        tracingDisabled: true,
      });
    const agent = (model: string = MODEL, maxTokens?: number) =>
      new Agent({
        name: "Assistant",
        instructions: "Be brief.",
        model,
        ...(maxTokens ? { modelSettings: { maxTokens } } : {}),
      });

    it("run: the final output and the run's usage", async () => {
      const result = await runner().run(agent(MODEL, 9), "Say something");
      expect(result.finalOutput?.trim().split(" ")).toHaveLength(9);
      const usage = result.runContext.usage;
      expect(usage.requests).toBe(1);
      expect(usage.outputTokens).toBe(9);
      expect(usage.inputTokens).toBeGreaterThan(0);
      expect(usage.totalTokens).toBe(usage.inputTokens + 9);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    });

    it("outputType: the final output is the object its JSON schema asked for, with the run's usage", async () => {
      const structured = new Agent({
        name: "Assistant",
        instructions: "Name a place.",
        model: MODEL,
        outputType: {
          type: "json_schema",
          name: "place",
          strict: true,
          schema: {
            type: "object",
            properties: { city: { type: "string" }, population: { type: "number" } },
            required: ["city", "population"],
            additionalProperties: false,
          },
        },
      });
      const result = await runner().run(structured, "Name a place");
      expect(result.finalOutput).toEqual({ city: expect.stringMatching(/^[a-z]+$/), population: 0 });
      // Responses sends text.format, chat completions response_format: the upstream got the latter either way.
      expect(gateway().upstream.requests.at(-1)?.body).toMatchObject({
        response_format: { type: "json_schema", json_schema: { name: "place", strict: true } },
      });
      const usage = result.runContext.usage;
      expect(usage.outputTokens).toBe(Math.ceil(JSON.stringify(result.finalOutput).length / 4));
      expect(usage.totalTokens).toBe(usage.inputTokens + usage.outputTokens);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    });

    it("run({ stream: true }): the text stream, then the final output and usage", async () => {
      const result = await runner().run(agent(), "Say something", { stream: true });
      const parts: string[] = [];
      for await (const part of result.toTextStream()) parts.push(part);
      await result.completed;
      expect(parts.length).toBeGreaterThan(1);
      // The upstream's whole answer is under the connection's default cap.
      expect(parts.join("").trim().split(" ")).toHaveLength(UPSTREAM_OUTPUT_TOKENS);
      expect(result.finalOutput).toBe(parts.join(""));
      const usage = result.runContext.usage;
      expect(usage.outputTokens).toBe(UPSTREAM_OUTPUT_TOKENS);
      expect(usage.inputTokens).toBeGreaterThan(0);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    });

    it("a conversation: the first run's history, its answer included, is the second run's input", async () => {
      const first = await runner().run(agent(MODEL, 4), "Hello");
      const second = await runner().run(agent(MODEL, 4), [
        ...first.history,
        { role: "user", content: "Again" },
      ]);
      expect(second.finalOutput?.trim().split(" ")).toHaveLength(4);
      expect(second.runContext.usage.inputTokens).toBeGreaterThan(first.runContext.usage.inputTokens);
      expect(JSON.stringify(gateway().upstream.requests.at(-1)?.body)).toContain(first.finalOutput?.trim());
    });

    // Only the Responses API names state kept by OpenAI; the chat model sends no such field.
    if (useResponses)
      it("conversationId and previousResponseId: refused with a 400 naming the field, nothing billed", async () => {
        const before = gateway().upstream.requests.length;
        const options = [
          [{ conversationId: "conv_1" }, "conversation"],
          [{ previousResponseId: "resp_1" }, "previous_response_id"],
        ] as const;
        for (const [option, field] of options) {
          const err = await rejection(runner().run(agent(), "hi", option));
          expect(err).toBeInstanceOf(OpenAI.BadRequestError);
          expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("invalid_request");
          expect((err as Error).message).toContain(`${field}: `);
          expect(gateway().wire.last()).toMatchObject({ path, status: 400 });
        }
        expect(gateway().upstream.requests.length).toBe(before);
      });

    /** The error a run rejects with for `refusal`: the openai SDK's class for its status. */
    async function expectRefused(refusal: Refusal, stream: boolean) {
      const run = stream
        ? runner(refusal.key)
            .run(agent(refusal.model), "hi", { stream: true })
            .then(async (r) => {
              for await (const _ of r.toTextStream());
              await r.completed;
            })
        : runner(refusal.key).run(agent(refusal.model), "hi");
      const err = await rejection(run);
      expectOpenAIError(err, refusal);
    }

    it("a run rejects with the openai SDK's error classes for 401, 402, 403 and 429", async () => {
      await gateway().fillRateLimit();
      for (const refusal of Object.values(REFUSALS)) {
        await expectRefused(refusal, false);
        await expectRefused(refusal, true);
      }
      if (useResponses) await expectRefused(ROUTE_REFUSAL, false);
    });
  });
});
