import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { expectedOutput, expectedUsage, type FakeUpstream, startFakeUpstream } from "./fake-upstream.js";

let fake: FakeUpstream;

beforeEach(async () => {
  fake = await startFakeUpstream({ record: true });
});

afterEach(async () => {
  await fake.close();
});

function post(path: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${fake.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal: AbortSignal.timeout(5_000),
  });
}

/** The parsed `data:` payloads of an SSE body; "[DONE]" stays a string. */
function events(text: string): unknown[] {
  return text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}

interface Chunk {
  choices: {
    index: number;
    delta: { role?: string; content?: string; reasoning_content?: string };
    text?: string;
    finish_reason: string | null;
  }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

/** The chunks of an SSE body, without [DONE] (which must be last). */
async function chunksOf(res: Response): Promise<Chunk[]> {
  const all = events(await res.text());
  expect(all.at(-1)).toBe("[DONE]");
  return all.slice(0, -1) as Chunk[];
}

/** Per choice index, the concatenated `content` (chat) or `text` (completions) of a stream. */
function textsByIndex(chunks: Chunk[], field: "content" | "text"): string[] {
  const texts: string[] = [];
  for (const c of chunks) {
    for (const choice of c.choices) {
      const t = field === "content" ? choice.delta?.content : choice.text;
      texts[choice.index] = (texts[choice.index] ?? "") + (t ?? "");
    }
  }
  return texts;
}

const hello = { model: "fake-small", messages: [{ role: "user", content: "Hello there" }] };

describe("fake upstream embeddings", () => {
  interface Embeddings {
    object: string;
    data: { object: string; index: number; embedding: number[] | string }[];
    model: string;
    usage: { prompt_tokens: number; total_tokens: number };
  }
  const embed = async (body: unknown) => {
    const res = await post("/embeddings", body);
    expect(res.status).toBe(200);
    return (await res.json()) as Embeddings;
  };
  const norm = (v: number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

  it("embeds each input as a deterministic unit vector, counting prompt tokens as chat does", async () => {
    // "Hello there" = 11 bytes → 3 + 3; "a" → 1 + 3; three token ids → 3.
    const body = await embed({ model: "fake-embed", input: ["Hello there", "a"] });
    expect(body).toMatchObject({
      object: "list",
      model: "fake-embed",
      usage: { prompt_tokens: 10, total_tokens: 10 },
    });
    expect(body.data.map((d) => [d.object, d.index])).toEqual([
      ["embedding", 0],
      ["embedding", 1],
    ]);
    const [first, second] = body.data.map((d) => d.embedding as number[]);
    expect(first).toHaveLength(256);
    expect(norm(first!)).toBeCloseTo(1, 5);
    expect(first).not.toEqual(second);
    const again = await embed({ model: "fake-embed", input: "Hello there" });
    expect(again.data[0]?.embedding).toEqual(first);
    const tokens = await embed({ model: "fake-embed", input: [1, 2, 3] });
    expect(tokens.usage.prompt_tokens).toBe(3);
  });

  it("honours dimensions and answers base64 float32 equal to the float answer", async () => {
    const floats = await embed({ model: "fake-embed", input: "x", dimensions: 8 });
    const b64 = await embed({ model: "fake-embed", input: "x", dimensions: 8, encoding_format: "base64" });
    const v = floats.data[0]?.embedding as number[];
    expect(v).toHaveLength(8);
    expect(norm(v)).toBeCloseTo(1, 5);
    const bytes = Buffer.from(b64.data[0]?.embedding as string, "base64");
    expect([...new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4)]).toEqual(v);
  });

  it("refuses an empty input and an unknown model", async () => {
    expect((await post("/embeddings", { model: "fake-embed", input: [] })).status).toBe(400);
    expect((await post("/embeddings", { model: "fake-embed", input: "" })).status).toBe(400);
    expect((await post("/embeddings", { model: "nope", input: "x" })).status).toBe(404);
  });
});

describe("fake upstream", () => {
  it("lists its models in OpenAI's shape", async () => {
    const res = await fetch(`${fake.url}/models`);
    expect(res.status).toBe(200);
    const body = (await res.json()) as {
      object: string;
      data: { id: string; object: string; owned_by: string }[];
    };
    expect(body.object).toBe("list");
    expect(body.data.map((m) => m.id)).toEqual(["fake-small", "fake-large", "fake-reasoner", "fake-embed"]);
    expect(body.data[0]).toMatchObject({ object: "model", owned_by: "fake" });
  });

  it("answers a buffered chat completion with deterministic text and exact usage", async () => {
    // "You are terse." = 14 bytes → 4 + 3; "Hello there" = 11 bytes → 3 + 3; text parts count as content.
    const request = {
      model: "fake-large",
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: [{ type: "text", text: "Hello there" }] },
      ],
    };
    const res = await post("/chat/completions", request);
    expect(res.status).toBe(200);
    const body = (await res.json()) as {
      object: string;
      model: string;
      choices: { message: { role: string; content: string }; finish_reason: string }[];
      usage: Record<string, unknown>;
    };
    expect(body.object).toBe("chat.completion");
    expect(body.model).toBe("fake-large");
    expect(body.usage).toEqual({ prompt_tokens: 13, completion_tokens: 12, total_tokens: 25 });
    expect(body.choices[0]?.finish_reason).toBe("stop");
    expect(body.choices[0]?.message.role).toBe("assistant");
    const content = body.choices[0]?.message.content ?? "";
    expect(content.trim().split(" ")).toHaveLength(12);
    expect(content).toBe(expectedOutput(request).texts[0]);

    const again = (await (await post("/chat/completions", request)).json()) as typeof body;
    expect(again.choices[0]?.message.content).toBe(content);
    expect(fake.requests.at(-1)).toMatchObject({
      method: "POST",
      path: "/v1/chat/completions",
      body: request,
    });
  });

  it("reports reasoning tokens for reasoning models", async () => {
    const res = await post("/chat/completions", { ...hello, model: "fake-reasoner" });
    const body = (await res.json()) as {
      choices: { message: { reasoning_content: string } }[];
      usage: { completion_tokens: number; completion_tokens_details: { reasoning_tokens: number } };
    };
    expect(body.choices[0]?.message.reasoning_content.trim().split(" ")).toHaveLength(4);
    expect(body.usage.completion_tokens).toBe(16);
    expect(body.usage.completion_tokens_details.reasoning_tokens).toBe(4);
  });

  it("keeps a reasoning model's thinking within the cap: reasoning and answer together never exceed max_tokens", async () => {
    for (const max_tokens of [1, 3, 6]) {
      const res = await post("/chat/completions", { ...hello, model: "fake-reasoner", max_tokens, n: 2 });
      const body = (await res.json()) as {
        usage: { completion_tokens: number; completion_tokens_details: { reasoning_tokens: number } };
      };
      expect(body.usage.completion_tokens, `max_tokens ${max_tokens}`).toBeLessThanOrEqual(max_tokens * 2);
      expect(body.usage.completion_tokens_details.reasoning_tokens).toBe(Math.min(4, max_tokens) * 2);
    }
  });

  it("cuts the output at the cap and says so in finish_reason", async () => {
    const res = await post("/chat/completions", { ...hello, max_completion_tokens: 5 });
    const body = (await res.json()) as {
      choices: { message: { content: string }; finish_reason: string }[];
      usage: { completion_tokens: number };
    };
    expect(body.choices[0]?.finish_reason).toBe("length");
    expect(body.usage.completion_tokens).toBe(5);
    expect(body.choices[0]?.message.content.trim().split(" ")).toHaveLength(5);
  });

  it("streams one chunk per token and no usage unless asked", async () => {
    const res = await post("/chat/completions", { ...hello, stream: true });
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    const all = events(await res.text());
    expect(all.at(-1)).toBe("[DONE]");
    const chunks = all.slice(0, -1) as Chunk[];
    expect(chunks[0]?.choices[0]?.delta).toEqual({ role: "assistant", content: "" });
    const tokens = chunks.slice(1, -1).map((c) => c.choices[0]?.delta.content);
    expect(tokens).toHaveLength(12);
    expect(tokens.join("")).toBe(expectedOutput(hello).texts[0]);
    expect(chunks.at(-1)?.choices[0]).toMatchObject({ delta: {}, finish_reason: "stop" });
    expect(chunks.some((c) => c.usage !== undefined)).toBe(false);
  });

  it("streams a usage chunk with empty choices when include_usage is set", async () => {
    const request = { ...hello, stream: true, stream_options: { include_usage: true }, max_tokens: 3 };
    const all = events(await (await post("/chat/completions", request)).text());
    expect(all.at(-1)).toBe("[DONE]");
    const usage = all.at(-2) as Chunk;
    expect(usage.choices).toEqual([]);
    // "Hello there" = 11 bytes → 3 + 3 prompt tokens.
    expect(usage.usage).toEqual({ prompt_tokens: 6, completion_tokens: 3, total_tokens: 9 });
    expect((all.at(-3) as Chunk).choices[0]?.finish_reason).toBe("length");
  });

  it("streams reasoning chunks before content chunks", async () => {
    const all = events(
      await (await post("/chat/completions", { ...hello, model: "fake-reasoner", stream: true })).text(),
    );
    const deltas = (all.slice(1, -2) as Chunk[]).map((c) => c.choices[0]?.delta);
    expect(deltas.slice(0, 4).every((d) => d?.reasoning_content !== undefined)).toBe(true);
    expect(deltas.slice(4).every((d) => d?.content !== undefined)).toBe(true);
    expect(deltas).toHaveLength(16);
  });

  it("serves legacy completions with one choice per prompt", async () => {
    const request = { model: "fake-small", prompt: ["one", "a longer prompt"], max_tokens: 2 };
    const res = await post("/completions", request);
    expect(res.status).toBe(200);
    const body = (await res.json()) as {
      object: string;
      choices: { index: number; text: string; finish_reason: string }[];
      usage: unknown;
    };
    expect(body.object).toBe("text_completion");
    expect(body.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(body.choices.map((c) => c.text)).toEqual(expectedOutput(request, { route: "completions" }).texts);
    expect(body.choices.every((c) => c.finish_reason === "length")).toBe(true);
    // "one" → 1 + 3, "a longer prompt" (15 bytes) → 4 + 3; two words for each prompt.
    expect(body.usage).toEqual({ prompt_tokens: 11, completion_tokens: 4, total_tokens: 15 });
  });

  it("rejects unknown models and invalid JSON with OpenAI-style errors", async () => {
    const unknown = await post("/chat/completions", { ...hello, model: "gpt-nope" });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: { code: string } }).error.code).toBe("model_not_found");

    const broken = await post("/chat/completions", "{not json");
    expect(broken.status).toBe(400);
    expect(((await broken.json()) as { error: { type: string } }).error.type).toBe("invalid_request_error");
  });

  it("fails the next requests as told, with Retry-After, then recovers", async () => {
    fake.failNext(2, { status: 429, retryAfter: "3" });
    for (let i = 0; i < 2; i++) {
      const res = await post("/chat/completions", hello);
      expect(res.status).toBe(429);
      expect(res.headers.get("retry-after")).toBe("3");
      const body = (await res.json()) as { error: { message: string; type: string; code: string } };
      expect(body.error.code).toBe("rate_limit_exceeded");
    }
    expect((await post("/chat/completions", hello)).status).toBe(200);
  });

  it("cuts a stream after the given number of chunks", async () => {
    fake.failNext(1, { afterChunks: 3 });
    const res = await post("/chat/completions", { ...hello, stream: true });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = "";
    await expect(
      (async () => {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return;
          text += decoder.decode(value, { stream: true });
        }
      })(),
    ).rejects.toThrow();
    const received = events(text) as Chunk[];
    // The role chunk and three content chunks arrived; no finish_reason, no [DONE].
    expect(received).toHaveLength(4);
    expect(received.slice(1).every((c) => c.choices[0]?.delta.content !== undefined)).toBe(true);
    expect(text).not.toContain("[DONE]");

    // The next stream is whole again.
    const next = events(await (await post("/chat/completions", { ...hello, stream: true })).text());
    expect(next.at(-1)).toBe("[DONE]");
  });

  it("paces a stream and stops writing when the client goes away", async () => {
    fake.configure({ ttftMs: 50, tokensPerSecond: 100 });
    const started = Date.now();
    const res = await post("/chat/completions", { ...hello, max_tokens: 4, stream: true });
    await res.text();
    // ttft 50 ms + 3 gaps of 10 ms between four tokens.
    expect(Date.now() - started).toBeGreaterThanOrEqual(75);

    fake.configure({ ttftMs: 0, tokensPerSecond: 20 });
    const controller = new AbortController();
    const cut = await fetch(`${fake.url}/chat/completions`, {
      method: "POST",
      body: JSON.stringify({ ...hello, stream: true }),
      signal: controller.signal,
    });
    const reader = cut.body!.getReader();
    await reader.read();
    controller.abort();
    await new Promise((r) => setTimeout(r, 150));
    // The fake is still healthy after the disconnect.
    expect((await post("/chat/completions", hello)).status).toBe(200);
  });

  it("answers a stream's status and headers at once, before its first token", async () => {
    // Far longer than post()'s 5 s timeout: the headers must not wait for the first token.
    fake.configure({ ttftMs: 60_000 });
    const res = await post("/chat/completions", { ...hello, stream: true });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    await res.body?.cancel();
  });

  it("requires the API key when one is configured", async () => {
    fake.configure({ apiKey: "sk-fake" });
    const denied = await post("/chat/completions", hello);
    expect(denied.status).toBe(401);
    const body = (await denied.json()) as { error: { message: string; type: string; code: string } };
    expect(body.error).toMatchObject({ type: "invalid_request_error", code: "invalid_api_key" });
    expect((await post("/chat/completions", hello, { authorization: "Bearer wrong" })).status).toBe(401);
    expect((await post("/chat/completions", hello, { authorization: "Bearer sk-fake" })).status).toBe(200);
  });

  it("fails every request while a standing failure is set, after any failNext() ones", async () => {
    fake.configure({ failure: { status: 503, retryAfter: "Wed, 21 Oct 2037 07:28:00 GMT" } });
    fake.failNext(1, { status: 500 });
    expect((await post("/chat/completions", hello)).status).toBe(500);
    for (let i = 0; i < 3; i++) {
      const res = await post("/chat/completions", { ...hello, stream: i === 2 });
      expect(res.status).toBe(503);
      expect(res.headers.get("retry-after")).toBe("Wed, 21 Oct 2037 07:28:00 GMT");
    }
    fake.configure({ failure: undefined });
    expect((await post("/chat/completions", hello)).status).toBe(200);
  });

  it("delays the first byte of an answer, buffered or streamed, and of an injected failure", async () => {
    fake.configure({ firstByteDelayMs: 150 });
    for (const stream of [false, true]) {
      const started = performance.now();
      const res = await post("/chat/completions", { ...hello, stream });
      // The status line itself waited: headers arrive only after the delay.
      expect(performance.now() - started).toBeGreaterThanOrEqual(140);
      expect(res.status).toBe(200);
      await res.text();
    }
    fake.configure({ firstByteDelayMs: 0 });
    fake.failNext(1, { status: 502, delayMs: 150 });
    const started = performance.now();
    expect((await post("/chat/completions", hello)).status).toBe(502);
    expect(performance.now() - started).toBeGreaterThanOrEqual(140);
  });

  it("close() ends hung requests", async () => {
    fake.failNext(1, { hang: true });
    const pending = post("/chat/completions", hello).then(
      () => "answered",
      () => "failed",
    );
    await new Promise((r) => setTimeout(r, 50));
    await fake.close();
    expect(await pending).toBe("failed");
    fake = await startFakeUpstream();
  });
});

describe("fake upstream, response_format asking for JSON", () => {
  const schema = {
    type: "object",
    properties: { city: { type: "string" }, population: { type: "integer" }, note: { type: "string" } },
    required: ["city", "population"],
    additionalProperties: false,
  };
  const asked = {
    ...hello,
    response_format: { type: "json_schema", json_schema: { name: "place", schema, strict: true } },
  };
  interface Completion {
    choices: { message: { content: string }; finish_reason: string }[];
    usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  }

  it("answers json_schema with the schema's minimal instance, one token per four characters", async () => {
    const res = await post("/chat/completions", asked);
    expect(res.status).toBe(200);
    const body = (await res.json()) as Completion;
    const content = body.choices[0]?.message.content ?? "";
    const parsed = JSON.parse(content) as { city: string; population: number };
    expect(Object.keys(parsed)).toEqual(["city", "population"]);
    expect(parsed.population).toBe(0);
    expect(parsed.city).toMatch(/^[a-z]+$/);
    expect(body.choices[0]?.finish_reason).toBe("stop");
    const tokens = Math.ceil(content.length / 4);
    // The prompt is counted as without response_format.
    expect(body.usage).toEqual({
      prompt_tokens: expectedUsage(hello).prompt_tokens,
      completion_tokens: tokens,
      total_tokens: expectedUsage(hello).prompt_tokens + tokens,
    });
    expect(expectedOutput(asked).texts[0]).toBe(content);
    // The same every time.
    expect(
      ((await (await post("/chat/completions", asked)).json()) as Completion).choices[0]?.message.content,
    ).toBe(content);
  });

  it("answers json_object with a JSON object, and text as without response_format", async () => {
    const json = (await (
      await post("/chat/completions", { ...hello, response_format: { type: "json_object" } })
    ).json()) as Completion;
    expect(JSON.parse(json.choices[0]?.message.content ?? "")).toEqual({ answer: expect.any(String) });
    const text = (await (
      await post("/chat/completions", { ...hello, response_format: { type: "text" } })
    ).json()) as Completion;
    expect(text.choices[0]?.message.content).toBe(expectedOutput(hello).texts[0]);
  });

  it("streams the JSON one token a chunk, and the cap cuts it", async () => {
    const whole = expectedOutput(asked).texts[0] ?? "";
    const res = await post("/chat/completions", {
      ...asked,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = events(await res.text()).slice(0, -1) as Chunk[];
    const pieces = chunks.slice(1, -2).map((c) => c.choices[0]?.delta.content);
    expect(pieces.join("")).toBe(whole);
    expect(pieces).toHaveLength(Math.ceil(whole.length / 4));
    expect(chunks.at(-1)?.usage?.completion_tokens).toBe(pieces.length);

    const cut = (await (await post("/chat/completions", { ...asked, max_tokens: 2 })).json()) as Completion;
    expect(cut.choices[0]?.message.content).toBe(whole.slice(0, 8));
    expect(cut.choices[0]?.finish_reason).toBe("length");
    expect(cut.usage.completion_tokens).toBe(2);
  });

  it("refuses a response_format it cannot answer with a 400", async () => {
    const res = await post("/chat/completions", { ...hello, response_format: { type: "xml" } });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { type: string } }).error.type).toBe("invalid_request_error");
  });
});

describe("fake upstream recording", () => {
  it("keeps no request unless started with record: true, and lets go of them when turned off", async () => {
    const quiet = await startFakeUpstream();
    try {
      const res = await fetch(`${quiet.url}/chat/completions`, {
        method: "POST",
        body: JSON.stringify({ ...hello, messages: [{ role: "user", content: "x".repeat(64 * 1024) }] }),
      });
      expect(res.status).toBe(200);
      expect(() => quiet.requests).toThrow(/record: true/);

      quiet.configure({ record: true });
      await (await fetch(`${quiet.url}/models`)).text();
      expect(quiet.requests.map((r) => r.path)).toEqual(["/v1/models"]);
      quiet.configure({ record: false });
      expect(() => quiet.requests).toThrow(/record: true/);
      quiet.configure({ record: true });
      expect(quiet.requests).toEqual([]);
    } finally {
      await quiet.close();
    }
  });
});

describe("fake upstream fan-out, as vLLM answers it", () => {
  interface Buffered {
    choices: {
      index: number;
      message?: { content: string; reasoning_content?: string };
      text?: string;
      finish_reason: string;
    }[];
    usage: {
      prompt_tokens: number;
      completion_tokens: number;
      total_tokens: number;
      completion_tokens_details?: { reasoning_tokens: number };
    };
  }

  it("answers n chat choices, each its own output up to the cap, and counts all of them", async () => {
    const request = { ...hello, n: 3, max_tokens: 5 };
    const body = (await (await post("/chat/completions", request)).json()) as Buffered;
    expect(body.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    const texts = body.choices.map((c) => c.message?.content ?? "");
    expect(texts.every((t) => t.trim().split(" ").length === 5)).toBe(true);
    expect(new Set(texts).size).toBe(3);
    expect(body.choices.every((c) => c.finish_reason === "length")).toBe(true);
    // Choice 0 is what n = 1 answers.
    expect(texts[0]).toBe(expectedOutput({ ...hello, max_tokens: 5 }).texts[0]);
    expect(texts).toEqual(expectedOutput(request).texts);
    // "Hello there" → 6 prompt tokens, counted once; 3 × 5 completion tokens.
    expect(body.usage).toEqual({ prompt_tokens: 6, completion_tokens: 15, total_tokens: 21 });
    expect(expectedUsage(request)).toEqual(body.usage);
  });

  it("gives every choice of a reasoning model its own reasoning, counted per choice", async () => {
    const request = { ...hello, model: "fake-reasoner", n: 2 };
    const body = (await (await post("/chat/completions", request)).json()) as Buffered;
    expect(body.choices.map((c) => c.message?.reasoning_content)).toEqual(expectedOutput(request).reasonings);
    expect(body.usage.completion_tokens).toBe(2 * (12 + 4));
    expect(body.usage.completion_tokens_details).toEqual({ reasoning_tokens: 8 });
  });

  it("streams every choice interleaved, one choice per chunk, and the totals last", async () => {
    const request = { ...hello, n: 3, max_tokens: 4, stream: true, stream_options: { include_usage: true } };
    const chunks = await chunksOf(await post("/chat/completions", request));
    expect(
      chunks.every((c) => c.choices.length === 1 || (c.choices.length === 0 && c === chunks.at(-1))),
    ).toBe(true);
    // A role chunk per choice, then token chunks round-robin: 0, 1, 2, 0, 1, 2, ...
    expect(chunks.slice(0, 3).map((c) => c.choices[0]?.delta)).toEqual([
      { role: "assistant", content: "" },
      { role: "assistant", content: "" },
      { role: "assistant", content: "" },
    ]);
    const tokenChunks = chunks.slice(3, 3 + 12);
    expect(tokenChunks.map((c) => c.choices[0]?.index)).toEqual([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
    expect(textsByIndex(chunks, "content")).toEqual(expectedOutput(request).texts);
    const finishes = chunks.slice(15, 18).map((c) => c.choices[0]);
    expect(finishes.map((f) => [f?.index, f?.finish_reason])).toEqual([
      [0, "length"],
      [1, "length"],
      [2, "length"],
    ]);
    expect(chunks.at(-1)).toMatchObject({
      choices: [],
      usage: { prompt_tokens: 6, completion_tokens: 12, total_tokens: 18 },
    });
    expect(chunks).toHaveLength(3 + 12 + 3 + 1);
  });

  it("answers a prompt list with n choices per prompt, index = prompt_index * n + j, usage summed", async () => {
    const request = { model: "fake-small", prompt: ["one", "a longer prompt"], n: 2, max_tokens: 3 };
    const body = (await (await post("/completions", request)).json()) as Buffered;
    expect(body.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    const expected = expectedOutput(request, { route: "completions" });
    expect(body.choices.map((c) => c.text)).toEqual(expected.texts);
    // Choices 0 and 2 (j = 0) are what n = 1 answers for each prompt.
    const single = expectedOutput({ ...request, n: 1 }, { route: "completions" }).texts;
    expect([expected.texts[0], expected.texts[2]]).toEqual(single);
    // Prompts 4 + 7 tokens, each counted once; 4 choices × 3 tokens.
    expect(body.usage).toEqual({ prompt_tokens: 11, completion_tokens: 12, total_tokens: 23 });

    const streamed = await chunksOf(
      await post("/completions", { ...request, stream: true, stream_options: { include_usage: true } }),
    );
    expect(textsByIndex(streamed, "text")).toEqual(expected.texts);
    expect(streamed.at(-1)?.usage).toEqual(body.usage);
  });

  it("counts the best_of sequences generated, not only the n returned", async () => {
    const request = { model: "fake-small", prompt: ["one", "two"], n: 2, best_of: 5, max_tokens: 3 };
    const body = (await (await post("/completions", request)).json()) as Buffered;
    expect(body.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    // 2 prompts × best_of 5 × 3 tokens; "one" and "two" are 4 prompt tokens each.
    expect(body.usage).toEqual({ prompt_tokens: 8, completion_tokens: 30, total_tokens: 38 });
    expect(expectedUsage(request, { route: "completions" })).toEqual(body.usage);

    const below = await post("/completions", { ...request, best_of: 1 });
    expect(below.status).toBe(400);
    const bad = await post("/chat/completions", { ...hello, n: 0 });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { code: string } }).error.code).toBe("invalid_value");
  });

  it.each([
    ["max_tokens alone", { max_tokens: 3 }, 3],
    ["max_completion_tokens alone", { max_completion_tokens: 4 }, 4],
    ["both, max_tokens smaller", { max_tokens: 2, max_completion_tokens: 9 }, 2],
    ["both, max_tokens larger", { max_tokens: 9, max_completion_tokens: 2 }, 9],
  ])("caps each choice's output by %s", async (_label, caps, perChoice) => {
    const request = { ...hello, n: 2, ...caps };
    const body = (await (await post("/chat/completions", request)).json()) as Buffered;
    expect(body.choices.map((c) => (c.message?.content ?? "").trim().split(" ").length)).toEqual([
      perChoice,
      perChoice,
    ]);
    expect(body.usage.completion_tokens).toBe(2 * perChoice);
  });

  it("puts usage on every chunk with continuous_usage_stats: the exact prompt tokens and the choice's tokens so far", async () => {
    const request = {
      ...hello,
      max_tokens: 3,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    };
    const chunks = await chunksOf(await post("/chat/completions", request));
    expect(chunks.every((c) => c.usage !== undefined)).toBe(true);
    expect(chunks.map((c) => c.usage?.completion_tokens)).toEqual([0, 1, 2, 3, 3, 3]);
    expect(chunks.every((c) => c.usage?.prompt_tokens === 6)).toBe(true);
    expect(chunks.every((c) => c.usage?.total_tokens === 6 + (c.usage?.completion_tokens ?? 0))).toBe(true);
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: expectedUsage(request) });

    // Without include_usage, continuous_usage_stats alone adds nothing.
    const plain = await chunksOf(
      await post("/chat/completions", { ...request, stream_options: { continuous_usage_stats: true } }),
    );
    expect(plain.some((c) => c.usage !== undefined)).toBe(false);
  });

  it("with n and a prompt list, each chunk's continuous usage is its own choice and prompt, as vLLM reports it", async () => {
    const request = {
      model: "fake-small",
      prompt: ["one", "a longer prompt"],
      n: 2,
      max_tokens: 2,
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    };
    const chunks = await chunksOf(await post("/completions", request));
    const tokenChunks = chunks.filter((c) => c.choices[0]?.text);
    expect(
      tokenChunks.map((c) => [c.choices[0]?.index, c.usage?.prompt_tokens, c.usage?.completion_tokens]),
    ).toEqual([
      [0, 4, 1],
      [1, 4, 1],
      [2, 7, 1],
      [3, 7, 1],
      [0, 4, 2],
      [1, 4, 2],
      [2, 7, 2],
      [3, 7, 2],
    ]);
    // Only the last chunk has the request's totals.
    expect(chunks.at(-1)?.usage).toEqual({ prompt_tokens: 11, completion_tokens: 8, total_tokens: 19 });
  });
});

describe("fake upstream, failures one input triggers", () => {
  it("fails only the requests whose body contains the trigger text, after any failNext() ones", async () => {
    fake.configure({ failWhen: { text: "poison-pill", failure: { status: 500 } } });
    const poisoned = { ...hello, messages: [{ role: "user", content: "please eat this poison-pill" }] };
    for (let i = 0; i < 3; i++) expect((await post("/chat/completions", poisoned)).status).toBe(500);
    expect((await post("/chat/completions", { ...poisoned, stream: true })).status).toBe(500);
    expect((await post("/chat/completions", hello)).status).toBe(200);
    fake.failNext(1, { status: 503 });
    expect((await post("/chat/completions", poisoned)).status).toBe(503);
    fake.configure({ failWhen: undefined });
    expect((await post("/chat/completions", poisoned)).status).toBe(200);
  });
});

describe("fake upstream, Anthropic Messages API", () => {
  /** The events of a Messages API stream: each an `event:` line, then its `data:` line. */
  const named = (text: string) =>
    text
      .split("\n\n")
      .filter((e) => e !== "")
      .map((e) => {
        const [name, data] = e.split("\n");
        const parsed = JSON.parse(data!.slice("data: ".length)) as Record<string, unknown>;
        expect(name).toBe(`event: ${String(parsed.type)}`);
        return parsed;
      });
  const VERSION = { "anthropic-version": "2023-06-01" };
  const message = (extra: Record<string, unknown> = {}) => ({
    model: "fake-small",
    max_tokens: 5,
    system: "Be brief.",
    messages: [{ role: "user", content: [{ type: "text", text: "Hello" }] }],
    ...extra,
  });
  /** The same conversation on the chat route: the fake answers both with the same words and counts. */
  const asChat = expectedOutput({
    model: "fake-small",
    max_tokens: 5,
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Hello" },
    ],
  });

  it("answers POST /v1/messages with chat's words and counts, in Anthropic's shape", async () => {
    const res = await post("/messages", message(), VERSION);
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, unknown>;
    expect(body).toMatchObject({
      type: "message",
      role: "assistant",
      model: "fake-small",
      content: [{ type: "text", text: asChat.texts[0] }],
      stop_reason: "max_tokens",
      stop_sequence: null,
      usage: { input_tokens: asChat.usage.prompt_tokens, output_tokens: 5 },
    });
    expect(body.id).toMatch(/^msg_/);
    expect(expectedOutput(message(), { route: "messages" }).usage).toEqual(asChat.usage);
  });

  it("streams the Messages API's events, one text delta per token, usage at start and end", async () => {
    const res = await post("/messages", message({ stream: true }), VERSION);
    const all = named(await res.text());
    expect(all.map((e) => e.type)).toEqual([
      "message_start",
      "content_block_start",
      "ping",
      ...Array(5).fill("content_block_delta"),
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    expect(all[0]).toMatchObject({ message: { usage: { input_tokens: asChat.usage.prompt_tokens } } });
    const text = all
      .filter((e) => e.type === "content_block_delta")
      .map((e) => (e.delta as { text: string }).text)
      .join("");
    expect(text).toBe(asChat.texts[0]);
    expect(all.at(-2)).toMatchObject({ delta: { stop_reason: "max_tokens" }, usage: { output_tokens: 5 } });
  });

  it("checks x-api-key and anthropic-version, requires max_tokens, and answers errors in Anthropic's shape", async () => {
    fake.configure({ apiKey: "sk-ant" });
    const noKey = await post("/messages", message(), VERSION);
    expect(noKey.status).toBe(401);
    expect(await noKey.json()).toEqual({
      type: "error",
      error: { type: "authentication_error", message: "Incorrect API key provided." },
    });
    // The Bearer header of the OpenAI routes is not the Messages API's.
    expect((await post("/messages", message(), { ...VERSION, authorization: "Bearer sk-ant" })).status).toBe(
      401,
    );
    const key = { ...VERSION, "x-api-key": "sk-ant" };
    expect((await post("/messages", message(), key)).status).toBe(200);
    expect((await post("/messages", message(), { "x-api-key": "sk-ant" })).status).toBe(400);
    const noCap = await post("/messages", message({ max_tokens: undefined }), key);
    expect(noCap.status).toBe(400);
    expect(await noCap.json()).toMatchObject({ error: { type: "invalid_request_error" } });
    fake.failNext(1, { status: 529 });
    const overloaded = await post("/messages", message(), key);
    expect(overloaded.status).toBe(529);
    expect(await overloaded.json()).toMatchObject({ type: "error", error: { type: "overloaded_error" } });
  });

  it("sends an injected error event after the given deltas", async () => {
    fake.failNext(1, { errorEvent: "overloaded_error", afterChunks: 2 });
    const res = await post("/messages", message({ stream: true }), VERSION);
    const all = named(await res.text());
    expect(all.filter((e) => e.type === "content_block_delta")).toHaveLength(2);
    expect(all.at(-1)).toEqual({
      type: "error",
      error: { type: "overloaded_error", message: "injected error event" },
    });
  });
});
