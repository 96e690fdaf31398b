import { describe, expect, expectTypeOf, it } from "vitest";
import {
  responseObjectSchema,
  responsesRequestSchema,
  type ResponseObject as WireResponseObject,
  type ResponsesRequest as WireResponsesRequest,
} from "../schemas/responses.js";
import { readChatAnswer } from "./chat-answer.js";
import {
  chatBodyFromResponses,
  itemReferencesOf,
  type ResponseObject,
  type ResponsesRequest,
  responseFromChat,
} from "./responses.js";
import { ResponsesStream } from "./responses-stream.js";

const parse = (body: unknown) => responsesRequestSchema.parse(body);

const chatJson = (content: string, finish = "stop", extra: Record<string, unknown> = {}) => ({
  id: "chatcmpl-1",
  object: "chat.completion",
  created: 1_700_000_000,
  model: "tollgate-mini",
  choices: [{ index: 0, message: { role: "assistant", content, ...extra }, finish_reason: finish }],
});

const LABELS = { id: "resp_abc", messageId: "msg_abc", model: "tollgate-mini", maxOutputTokens: 64, now: 1 };

describe("chatBodyFromResponses", () => {
  it("turns instructions into a leading system message and a string input into one user message", () => {
    const req = parse({
      input: "What is a tollgate?",
      instructions: "Answer in one line.",
      temperature: 0.2,
      top_p: 0.9,
    });
    expect(chatBodyFromResponses(req, "tollgate-mini", 64)).toEqual({
      model: "tollgate-mini",
      messages: [
        { role: "system", content: "Answer in one line." },
        { role: "user", content: "What is a tollgate?" },
      ],
      max_tokens: 64,
      temperature: 0.2,
      top_p: 0.9,
    });
  });

  it("keeps a message list in order, text parts as chat text parts, developer as system", () => {
    const req = parse({
      input: [
        { role: "developer", content: "Be brief." },
        { type: "message", role: "user", content: [{ type: "input_text", text: "Hi" }] },
        { role: "assistant", content: [{ type: "output_text", text: "Hello!", annotations: [] }] },
        { role: "user", content: "And now?" },
      ],
    });
    expect(chatBodyFromResponses(req, "m", undefined)).toEqual({
      model: "m",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: [{ type: "text", text: "Hi" }] },
        { role: "assistant", content: [{ type: "text", text: "Hello!" }] },
        { role: "user", content: "And now?" },
      ],
    });
  });
});

describe("text.format", () => {
  const schema = {
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  };

  it("asks the upstream for JSON as the chat response_format, fields the request left out left out", () => {
    const formatOf = (format: unknown) =>
      chatBodyFromResponses(parse({ input: "hi", text: { format } }), "m", undefined).response_format;
    expect(formatOf({ type: "json_object" })).toEqual({ type: "json_object" });
    expect(
      formatOf({ type: "json_schema", name: "place", schema, strict: true, description: "A city." }),
    ).toEqual({
      type: "json_schema",
      json_schema: { name: "place", schema, strict: true, description: "A city." },
    });
    expect(formatOf({ type: "json_schema", name: "place", schema })).toEqual({
      type: "json_schema",
      json_schema: { name: "place", schema },
    });
    expect(formatOf({ type: "json_schema", name: "place", schema, strict: null })).toEqual({
      type: "json_schema",
      json_schema: { name: "place", schema },
    });
    // Text is the upstream's default: nothing is added.
    expect(formatOf({ type: "text" })).toBeUndefined();
    expect(formatOf(undefined)).toBeUndefined();
    expect(
      chatBodyFromResponses(parse({ input: "hi", text: { verbosity: "low" } }), "m", undefined),
    ).not.toHaveProperty("response_format");
  });

  it("is echoed in the response object as the request sent it, text by default", () => {
    const usage = { inputTokens: 1, outputTokens: 1, reasoningTokens: 0 };
    const echo = (body: Record<string, unknown>) => {
      const res = responseFromChat(
        parse({ input: "hi", ...body }),
        readChatAnswer(chatJson("{}")),
        usage,
        LABELS,
      );
      expect(responseObjectSchema.parse(res)).toEqual(res);
      return res.text;
    };
    expect(echo({})).toEqual({ format: { type: "text" } });
    expect(echo({ text: { format: { type: "json_object" }, verbosity: "low" } })).toEqual({
      format: { type: "json_object" },
    });
    expect(echo({ text: { format: { type: "json_schema", name: "place", schema, strict: true } } })).toEqual({
      format: { type: "json_schema", name: "place", schema, strict: true },
    });
  });

  it("and metadata are echoed by a stream's response.created and response.completed", () => {
    const format = { type: "json_schema", name: "place", schema, strict: false };
    const metadata = { user: "u1", topic: "cities" };
    const stream = new ResponsesStream(parse({ input: "hi", text: { format }, metadata }), LABELS);
    const created = stream.start()[0]!;
    stream.chunk({ choices: [{ index: 0, delta: { content: '{"city":""}' }, finish_reason: "stop" }] });
    const completed = stream.finish({ inputTokens: 1, outputTokens: 1, reasoningTokens: 0 }).at(-1)!;
    expect(created.event).toBe("response.created");
    expect(completed.event).toBe("response.completed");
    for (const event of [created, completed]) {
      expect((event.data as { response: object }).response).toMatchObject({ text: { format }, metadata });
    }
  });
});

describe("responseFromChat", () => {
  const usage = { inputTokens: 10, outputTokens: 7, reasoningTokens: 0 };

  it("answers with a completed response whose output message and output_text carry the text", () => {
    const req = parse({ input: "hi", instructions: "be kind" });
    const res = responseFromChat(req, readChatAnswer(chatJson("hello there")), usage, LABELS);
    expect(responseObjectSchema.safeParse(res).success).toBe(true);
    expect(res).toMatchObject({
      id: "resp_abc",
      object: "response",
      created_at: 1_700_000_000,
      status: "completed",
      incomplete_details: null,
      model: "tollgate-mini",
      instructions: "be kind",
      max_output_tokens: 64,
      output: [
        {
          type: "message",
          id: "msg_abc",
          status: "completed",
          role: "assistant",
          content: [{ type: "output_text", text: "hello there", annotations: [] }],
        },
      ],
      output_text: "hello there",
      usage: {
        input_tokens: 10,
        output_tokens: 7,
        total_tokens: 17,
        output_tokens_details: { reasoning_tokens: 0 },
      },
    });
  });

  it("is incomplete with reason max_output_tokens when the cap cut the answer", () => {
    const res = responseFromChat(
      parse({ input: "hi" }),
      readChatAnswer(chatJson("cut", "length")),
      usage,
      LABELS,
    );
    expect(res.status).toBe("incomplete");
    expect(res.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(res.output[0]?.status).toBe("incomplete");
    expect(res.output_text).toBe("cut");
  });

  it("echoes the request's metadata, {} without any", () => {
    const metadata = { user: "u1", trace: "t-42" };
    const answer = readChatAnswer(chatJson("hi"));
    expect(responseFromChat(parse({ input: "hi", metadata }), answer, usage, LABELS).metadata).toEqual(
      metadata,
    );
    expect(responseFromChat(parse({ input: "hi" }), answer, usage, LABELS).metadata).toEqual({});
  });

  it("reports reasoning tokens without putting the reasoning into the output text", () => {
    const answer = readChatAnswer(chatJson("42", "stop", { reasoning_content: "six times seven" }));
    const res = responseFromChat(parse({ input: "?" }), answer, { ...usage, reasoningTokens: 4 }, LABELS);
    expect(res.output_text).toBe("42");
    expect(res.usage.output_tokens_details.reasoning_tokens).toBe(4);
  });
});

describe("item references", () => {
  it("are found with their places and become the assistant messages they name", () => {
    const req = parse({
      input: [
        { role: "user", content: "a" },
        { type: "item_reference", id: "msg_1" },
        { role: "user", content: "b" },
        { type: "item_reference", id: "msg_2" },
      ],
    });
    expect(itemReferencesOf(req.input)).toEqual([
      { index: 1, id: "msg_1" },
      { index: 3, id: "msg_2" },
    ]);
    expect(chatBodyFromResponses(req, "m", undefined, ["first", "second"]).messages).toEqual([
      { role: "user", content: "a" },
      { role: "assistant", content: "first" },
      { role: "user", content: "b" },
      { role: "assistant", content: "second" },
    ]);
    expect(itemReferencesOf("hi")).toEqual([]);
  });
});

describe("responsesRequestSchema", () => {
  const issues = (body: unknown) => {
    const r = responsesRequestSchema.safeParse(body);
    return r.success ? [] : r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
  };

  it("takes stream as a boolean (the route streams)", () => {
    expect(issues({ input: "hi", stream: true })).toEqual([]);
    expect(issues({ input: "hi", stream: false })).toEqual([]);
    expect(issues({ input: "hi", stream: "yes" })).toHaveLength(1);
  });

  it("refuses non-text content, previous_response_id and tools with clear messages", () => {
    expect(
      issues({ input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] }).join(),
    ).toBe("input: 0.content: 0.type: only text content (input_text, output_text) is accepted on this route");
    expect(issues({ input: "hi", previous_response_id: "resp_1" }).join()).toContain("not stored");
    expect(issues({ input: "hi", tools: [{ type: "web_search" }] }).join()).toContain(
      "tools are not supported",
    );
    expect(issues({ input: "hi", tools: [] })).toEqual([]);
  });

  it("refuses the state OpenAI keeps and this route does not: a conversation, a stored prompt", () => {
    // The Agents SDK's `conversationId` run option sends `conversation`: answered without its
    // items, the caller would get an answer that silently lacks the conversation.
    expect(issues({ input: "hi", conversation: "conv_1" })).toEqual([
      "conversation: conversations are not stored: send the conversation as input",
    ]);
    expect(issues({ input: "hi", conversation: { id: "conv_1" } })).toHaveLength(1);
    expect(issues({ input: "hi", prompt: { id: "pmpt_1", version: "2" } })).toEqual([
      "prompt: stored prompts are not offered: send the instructions and input",
    ]);
    expect(issues({ input: "hi", conversation: null, prompt: null })).toEqual([]);
  });

  it("takes item references to stored answers (the AI SDK's default when storing) and store", () => {
    expect(
      issues({
        input: [
          { role: "user", content: "a" },
          { type: "item_reference", id: "msg_1" },
          { role: "user", content: "b" },
        ],
        store: true,
      }),
    ).toEqual([]);
    expect(issues({ input: [{ type: "item_reference" }] })).toEqual([
      expect.stringMatching(/^input: 0\.id: /),
    ]);
    expect(issues({ input: [{ type: "function_call_output", output: "x" }] })).toEqual([
      "input: 0.type: only message and item_reference items are accepted in input",
    ]);
    expect(issues({ input: "hi", top_p: 1.5 })).toHaveLength(1);
  });

  it("takes text.format text, json_object and json_schema, and refuses any other with its place", () => {
    const schema = { type: "object", properties: {} };
    const format = (f: unknown) => issues({ input: "hi", text: { format: f } });
    expect(format({ type: "text" })).toEqual([]);
    expect(format({ type: "json_object" })).toEqual([]);
    expect(format({ type: "json_schema", name: "a-B_9", schema, strict: true, description: "d" })).toEqual(
      [],
    );
    expect(issues({ input: "hi", text: { verbosity: "high" } })).toEqual([]);
    expect(format({ type: "xml" })).toEqual([
      expect.stringMatching(
        /^text\.format\.type: format must be \{type: "text"\}, \{type: "json_object"\} or/,
      ),
    ]);
    expect(format("json")).toEqual([expect.stringMatching(/^text\.format: /)]);
    expect(format({ type: "json_schema", name: "has space", schema })).toEqual([
      "text.format.name: name must be 1 to 64 letters, digits, _ or -",
    ]);
    expect(format({ type: "json_schema", name: "n".repeat(65), schema })).toHaveLength(1);
    expect(format({ type: "json_schema", name: "", schema })).toHaveLength(1);
    expect(format({ type: "json_schema", name: "x" })).toEqual([
      "text.format.schema: schema must be a JSON Schema object",
    ]);
    expect(format({ type: "json_schema", name: "x", schema: [] })).toEqual([
      "text.format.schema: schema must be a JSON Schema object",
    ]);
    expect(format({ type: "json_schema", name: "x", schema, strict: "yes" })).toEqual([
      expect.stringMatching(/^text\.format\.strict: /),
    ]);
  });

  it("takes metadata of at most 16 string keys of at most 64 characters with string values of at most 512", () => {
    const many = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, "v"]));
    expect(issues({ input: "hi", metadata: many(16) })).toEqual([]);
    expect(issues({ input: "hi", metadata: { ["k".repeat(64)]: "v".repeat(512) } })).toEqual([]);
    const rule = "metadata must be an object of at most 16 keys of at most 64 characters";
    expect(issues({ input: "hi", metadata: many(17) })).toEqual([
      expect.stringContaining(`metadata: ${rule}`),
    ]);
    expect(issues({ input: "hi", metadata: { ["k".repeat(65)]: "v" } })).toEqual([
      expect.stringContaining(`metadata.${"k".repeat(65)}: ${rule}`),
    ]);
    expect(issues({ input: "hi", metadata: { k: "v".repeat(513) } })).toEqual([
      expect.stringContaining(`metadata.k: ${rule}`),
    ]);
    expect(issues({ input: "hi", metadata: { k: 1 } })).toEqual([
      expect.stringContaining(`metadata.k: ${rule}`),
    ]);
    expect(issues({ input: "hi", metadata: ["v"] })).toEqual([expect.stringContaining(`metadata: ${rule}`)]);
  });

  it("requires input, and says where a message list is wrong", () => {
    expect(issues({ instructions: "x" })).toEqual([
      "input: input must be a string or a list of messages {role, content}",
    ]);
    expect(
      issues({
        input: [
          { role: "user", content: "a" },
          { role: "robot", content: "b" },
        ],
      }),
    ).toEqual([expect.stringMatching(/^input: 1\.role: /)]);
  });
});

describe("the domain's shapes and the wire schemas", () => {
  it("a parsed request is a ResponsesRequest, a ResponseObject fits the response schema (checked by tsc)", () => {
    expectTypeOf<WireResponsesRequest>().toExtend<ResponsesRequest>();
    expectTypeOf<ResponseObject>().toExtend<WireResponseObject>();
  });
});
