import type { AIMessageChunk } from "@langchain/core/messages";
import { ChatOpenAI, type ChatOpenAIFields } from "@langchain/openai";
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

/**
 * LangChain JS's `ChatOpenAI` (`@langchain/openai`), configured as its docs show for an
 * OpenAI-compatible server (`configuration.baseURL` at the gateway's /v1, the Virtual Key as
 * `apiKey`), by default (chat completions) and with `useResponsesApi: true`: `invoke` and
 * `stream`, usage as the message's own `usage_metadata` reports it, and refusals as LangChain's
 * users see them: the openai SDK's own error classes, passed through with LangChain's
 * `lc_error_code` added for 401 and 429. The books of every account used are checked after each
 * case.
 */
describe("LangChain ChatOpenAI against the account door", () => {
  const gateway = useClientGateway();

  const modes: {
    name: string;
    path: string;
    fields: ChatOpenAIFields;
    /** How `response_metadata` says the output cap cut the answer. */
    cut: Record<string, unknown>;
  }[] = [
    {
      name: "default (chat completions)",
      path: "/v1/chat/completions",
      fields: {},
      cut: { finish_reason: "length" },
    },
    {
      name: "useResponsesApi: true",
      path: "/v1/responses",
      fields: { useResponsesApi: true },
      cut: { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } },
    },
  ];

  describe.each(modes)("$name", ({ path, fields, cut }) => {
    const chat = (key: string = KEYS.served, more: ChatOpenAIFields = {}) =>
      new ChatOpenAI({
        model: MODEL,
        apiKey: key,
        maxRetries: 0,
        configuration: { baseURL: `${gateway().url}/v1`, fetch: gateway().wire.fetch },
        ...fields,
        ...more,
      });

    it("invoke: the text, usage_metadata, and how the cap cut it", async () => {
      const message = await chat(KEYS.served, { maxTokens: 7 }).invoke([
        ["system", "Be brief."],
        ["human", "Say something"],
      ]);
      expect(message.text.trim().split(" ")).toHaveLength(7);
      expect(message.response_metadata).toMatchObject({ ...cut, model_name: MODEL });
      expect(message.usage_metadata?.output_tokens).toBe(7);
      expect(message.usage_metadata?.input_tokens).toBeGreaterThan(0);
      expect(message.usage_metadata?.total_tokens).toBe((message.usage_metadata?.input_tokens ?? 0) + 7);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    });

    it("stream: the text in chunks, their concatenation carrying usage_metadata", async () => {
      const stream = await chat().stream("Say something");
      let whole: AIMessageChunk | undefined;
      let chunks = 0;
      for await (const chunk of stream) {
        chunks += 1;
        whole = whole ? whole.concat(chunk) : chunk;
      }
      expect(chunks).toBeGreaterThan(1);
      // The upstream's whole answer is under the connection's default cap.
      expect(whole?.text.trim().split(" ")).toHaveLength(UPSTREAM_OUTPUT_TOKENS);
      expect(whole?.usage_metadata?.output_tokens).toBe(UPSTREAM_OUTPUT_TOKENS);
      expect(whole?.usage_metadata?.input_tokens).toBeGreaterThan(0);
      expect(gateway().wire.last()).toMatchObject({ path, status: 200 });
      expect(gateway().wire.last().cost).toBeGreaterThan(0n);
    });

    it("a conversation: the earlier AIMessage goes back as input", async () => {
      const model = chat(KEYS.served, { maxTokens: 4 });
      const first = await model.invoke("Hello");
      const second = await model.invoke([["human", "Hello"], first, ["human", "Again"]]);
      expect(second.text.trim().split(" ")).toHaveLength(4);
      expect(second.usage_metadata?.input_tokens).toBeGreaterThan(first.usage_metadata?.input_tokens ?? 0);
      expect(JSON.stringify(gateway().upstream.requests.at(-1)?.body)).toContain(first.text.trim());
    });

    /** The error `invoke` raises for `refusal`: the openai SDK's class, LangChain's code added. */
    async function expectRefused(refusal: Refusal, call: "invoke" | "stream") {
      const model = chat(refusal.key, { model: refusal.model });
      const err = await rejection(
        call === "invoke"
          ? model.invoke("hi")
          : model.stream("hi").then(async (s) => {
              for await (const _ of s);
            }),
      );
      expectOpenAIError(err, refusal);
      const lcCode = { 401: "MODEL_AUTHENTICATION", 429: "MODEL_RATE_LIMIT" } as Record<number, string>;
      expect((err as { lc_error_code?: string }).lc_error_code).toBe(lcCode[refusal.status]);
    }

    it("invoke and stream raise the openai SDK's error classes for 401, 402, 403 and 429", async () => {
      await gateway().fillRateLimit();
      for (const refusal of Object.values(REFUSALS)) {
        await expectRefused(refusal, "invoke");
        await expectRefused(refusal, "stream");
      }
      if (path === "/v1/responses") await expectRefused(ROUTE_REFUSAL, "invoke");
    });
  });
});
