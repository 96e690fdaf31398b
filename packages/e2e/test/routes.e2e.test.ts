import { expectedOutput } from "@tollgate/testkit/fake-upstream";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * The account door's other routes (docs/contract.md, "The two doors"), on the multi-process stack:
 * the official openai SDK for /v1/completions, /v1/responses and /v1/models, plain HTTP for
 * /v1/think. The demo configuration serves tollgate-mini (fake-small), tollgate-pro and
 * tollgate-reasoner (fake-reasoner, `reasoning: true`); the fake upstream's answers are
 * deterministic, so each route's text is checked against what the upstream produces for the request
 * it was sent.
 */
const namespace = uniqueNamespace("routes");
const PROMPT = "Name three birds that winter near the coast";

interface ErrorBody {
  error: { message: string; type: string; code: string; request_id: string };
}

describe("account routes on the multi-process stack: completions, responses, think", () => {
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  let client: OpenAI;

  /** POSTs JSON with the demo key, or with no Authorization at all when key is null. */
  const post = (path: string, body: unknown, key: string | null = stack.demoKey) =>
    fetch(`${stack.url}${path}`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...(key !== null ? { authorization: `Bearer ${key}` } : {}),
      },
      body: JSON.stringify(body),
    });

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1 });
    client = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: stack.demoKey, maxRetries: 0 });
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  it("GET /v1/models lists the key's models through the SDK", async () => {
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids).toEqual(["tollgate-mini", "tollgate-pro", "tollgate-reasoner", "tollgate-embed-mini"]);
  });

  describe("POST /v1/completions", () => {
    it("answers a buffered completion with choices[].text, one per prompt, and usage", async () => {
      const res = await client.completions.create({
        model: "tollgate-mini",
        prompt: [PROMPT, `${PROMPT}, please`],
        max_tokens: 5,
      });
      const expected = expectedOutput(
        { model: "fake-small", prompt: [PROMPT, `${PROMPT}, please`], max_tokens: 5 },
        { route: "completions" },
      );
      expect(res.object).toBe("text_completion");
      expect(res.model).toBe("tollgate-mini");
      expect(res.choices.map((c) => c.text)).toEqual(expected.texts);
      expect(res.choices.map((c) => c.finish_reason)).toEqual(["length", "length"]);
      expect(res.usage).toMatchObject({ completion_tokens: 10, prompt_tokens: expected.usage.prompt_tokens });
    });

    it("streams SSE chunks the SDK reads with for await, the same text as buffered, usage last", async () => {
      const params = { model: "tollgate-pro", prompt: PROMPT, max_tokens: 6 };
      const buffered = await client.completions.create(params);
      const stream = await client.completions.create({
        ...params,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = "";
      let chunks = 0;
      let usage: OpenAI.CompletionUsage | undefined;
      for await (const chunk of stream) {
        chunks++;
        expect(chunk.model).toBe("tollgate-pro");
        text += chunk.choices[0]?.text ?? "";
        if (chunk.usage) usage = chunk.usage;
      }
      expect(chunks).toBeGreaterThan(6);
      expect(text).toBe(buffered.choices[0]?.text);
      expect(usage?.completion_tokens).toBe(6);
    });

    it("ends the raw stream with data: [DONE]", async () => {
      const res = await post("/v1/completions", {
        model: "tollgate-mini",
        prompt: PROMPT,
        max_tokens: 2,
        stream: true,
      });
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toContain("text/event-stream");
      expect((await res.text()).trimEnd().endsWith("data: [DONE]")).toBe(true);
    });

    it("uses the connection's default model when model is omitted", async () => {
      const res = await post("/v1/completions", { prompt: PROMPT, max_tokens: 3 });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { model: string }).model).toBe("tollgate-mini");
    });

    it("refuses token-id prompts with 400 invalid_request", async () => {
      const res = await post("/v1/completions", { model: "tollgate-mini", prompt: [1, 2, 3] });
      expect(res.status).toBe(400);
      expect(((await res.json()) as ErrorBody).error.code).toBe("invalid_request");
    });
  });

  describe("POST /v1/responses", () => {
    it("answers client.responses.create with output_text, instructions sent as the system message", async () => {
      const res = await client.responses.create({
        model: "tollgate-mini",
        instructions: "Answer briefly.",
        input: PROMPT,
        max_output_tokens: 50,
      });
      const expected = expectedOutput({
        model: "fake-small",
        max_tokens: 50,
        messages: [
          { role: "system", content: "Answer briefly." },
          { role: "user", content: PROMPT },
        ],
      });
      expect(res.id).toMatch(/^resp_/);
      expect(res.object).toBe("response");
      expect(res.status).toBe("completed");
      expect(res.model).toBe("tollgate-mini");
      expect(res.output_text).toBe(expected.texts[0]);
      expect(res.output[0]).toMatchObject({ type: "message", role: "assistant", status: "completed" });
      expect(res.usage).toMatchObject({
        input_tokens: expected.usage.prompt_tokens,
        output_tokens: expected.usage.completion_tokens,
        total_tokens: expected.usage.total_tokens,
        output_tokens_details: { reasoning_tokens: 0 },
      });
    });

    it("takes a message list with input_text parts, and is incomplete when the cap cuts the answer", async () => {
      const res = await client.responses.create({
        model: "tollgate-pro",
        max_output_tokens: 4,
        input: [
          { role: "developer", content: "Be terse." },
          { role: "user", content: [{ type: "input_text", text: PROMPT }] },
        ],
      });
      expect(res.status).toBe("incomplete");
      expect(res.incomplete_details?.reason).toBe("max_output_tokens");
      expect(res.output_text.trim().split(" ")).toHaveLength(4);
      expect(res.usage?.output_tokens).toBe(4);
    });

    it("checks the key before the body: no key with stream: true is a 401", async () => {
      const res = await post("/v1/responses", { input: PROMPT, stream: true }, null);
      expect(res.status).toBe(401);
    });
  });

  describe("POST /v1/think", () => {
    it("separates the answer from the reasoning on a reasoning model, with reasoning tokens in usage", async () => {
      const res = await post("/v1/think", {
        model: "tollgate-reasoner",
        prompt: PROMPT,
        reasoning_effort: "low",
        max_output_tokens: 8,
      });
      expect(res.status).toBe(200);
      const body = (await res.json()) as {
        id: string;
        object: string;
        model: string;
        answer: string;
        reasoning: string | null;
        finish_reason: string;
        usage: {
          input_tokens: number;
          output_tokens: number;
          reasoning_tokens: number;
          total_tokens: number;
        };
      };
      const expected = expectedOutput({
        model: "fake-reasoner",
        max_tokens: 8,
        messages: [{ role: "user", content: PROMPT }],
      });
      expect(body.id).toMatch(/^think_/);
      expect(body.object).toBe("think");
      expect(body.model).toBe("tollgate-reasoner");
      expect(body.answer).toBe(expected.texts[0]);
      expect(body.reasoning).toBe(expected.reasoning);
      expect(body.usage.reasoning_tokens).toBeGreaterThan(0);
      expect(body.usage).toEqual({
        input_tokens: expected.usage.prompt_tokens,
        output_tokens: expected.usage.completion_tokens,
        reasoning_tokens: expected.usage.completion_tokens_details?.reasoning_tokens,
        total_tokens: expected.usage.total_tokens,
      });
    });

    it("takes chat messages as well as a prompt", async () => {
      const res = await post("/v1/think", {
        model: "tollgate-reasoner",
        messages: [{ role: "user", content: PROMPT }],
        max_tokens: 8,
      });
      expect(res.status).toBe(200);
      const expected = expectedOutput({
        model: "fake-reasoner",
        max_tokens: 8,
        messages: [{ role: "user", content: PROMPT }],
      });
      expect(((await res.json()) as { answer: string }).answer).toBe(expected.texts[0]);
    });

    it("refuses a model that cannot reason with 400, also when it is the connection's default", async () => {
      for (const body of [{ model: "tollgate-mini", prompt: PROMPT }, { prompt: PROMPT }]) {
        const res = await post("/v1/think", body);
        expect(res.status).toBe(400);
        const { error } = (await res.json()) as ErrorBody;
        expect(error.code).toBe("model_cannot_reason");
        expect(error.message).toContain("'tollgate-mini' cannot reason");
      }
    });

    it("refuses messages and prompt together with 400 invalid_request", async () => {
      const res = await post("/v1/think", {
        model: "tollgate-reasoner",
        prompt: PROMPT,
        messages: [{ role: "user", content: PROMPT }],
      });
      expect(res.status).toBe(400);
      const { error } = (await res.json()) as ErrorBody;
      expect(error.code).toBe("invalid_request");
      expect(error.message).toContain("not both");
    });
  });
});
