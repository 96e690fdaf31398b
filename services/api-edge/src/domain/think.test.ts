import { describe, expect, expectTypeOf, it } from "vitest";
import {
  thinkOutputCapOf,
  thinkRequestSchema,
  thinkResponseSchema,
  type ThinkRequest as WireThinkRequest,
  type ThinkResponse as WireThinkResponse,
} from "../schemas/think.js";
import { readChatAnswer } from "./chat-answer.js";
import { chatBodyFromThink, type ThinkRequest, type ThinkResponse, thinkFromChat } from "./think.js";

const issues = (body: unknown) => {
  const r = thinkRequestSchema.safeParse(body);
  return r.success ? [] : r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
};

describe("thinkRequestSchema", () => {
  it("takes messages or a prompt, exactly one of them", () => {
    expect(issues({ prompt: "why?" })).toEqual([]);
    expect(issues({ messages: [{ role: "user", content: "why?" }] })).toEqual([]);
    expect(issues({})).toEqual(["messages: give messages or prompt"]);
    expect(issues({ prompt: "a", messages: [{ role: "user", content: "b" }] })).toEqual([
      "prompt: give messages or prompt, not both",
    ]);
  });

  it("accepts only low, medium or high as reasoning_effort", () => {
    expect(issues({ prompt: "x", reasoning_effort: "high" })).toEqual([]);
    expect(issues({ prompt: "x", reasoning_effort: "max" })).toHaveLength(1);
  });

  it("refuses unknown fields and stream: true", () => {
    expect(issues({ prompt: "x", max_completion_tokens: 5 }).join()).toContain("max_completion_tokens");
    expect(issues({ prompt: "x", stream: true }).join()).toContain("buffered");
  });

  it("takes the smaller of max_output_tokens and max_tokens as the output cap", () => {
    expect(thinkOutputCapOf(thinkRequestSchema.parse({ prompt: "x", max_tokens: 9 }))).toBe(9);
    expect(
      thinkOutputCapOf(thinkRequestSchema.parse({ prompt: "x", max_tokens: 9, max_output_tokens: 20 })),
    ).toBe(9);
    expect(
      thinkOutputCapOf(thinkRequestSchema.parse({ prompt: "x", max_tokens: 900, max_output_tokens: 20 })),
    ).toBe(20);
    expect(thinkOutputCapOf(thinkRequestSchema.parse({ prompt: "x" }))).toBeUndefined();
  });
});

describe("chatBodyFromThink", () => {
  it("turns a prompt into one user message and passes reasoning_effort and temperature on", () => {
    const req = thinkRequestSchema.parse({ prompt: "why?", reasoning_effort: "low", temperature: 0.5 });
    expect(chatBodyFromThink(req, "tollgate-reasoner", 128)).toEqual({
      model: "tollgate-reasoner",
      messages: [{ role: "user", content: "why?" }],
      max_tokens: 128,
      temperature: 0.5,
      reasoning_effort: "low",
    });
  });

  it("keeps messages as given", () => {
    const messages = [
      { role: "system", content: "be terse" },
      { role: "user", content: "why?" },
    ];
    const req = thinkRequestSchema.parse({ messages });
    expect(chatBodyFromThink(req, "m", undefined)).toEqual({ model: "m", messages });
  });
});

describe("thinkFromChat", () => {
  const labels = { id: "think_1", model: "tollgate-reasoner", now: 5 };
  const usage = { inputTokens: 11, outputTokens: 9, reasoningTokens: 4 };

  it("separates the answer from the reasoning and counts reasoning tokens", () => {
    const answer = readChatAnswer({
      created: 1_700_000_000,
      choices: [
        {
          message: { role: "assistant", content: "42", reasoning_content: "six times seven" },
          finish_reason: "stop",
        },
      ],
    });
    const res = thinkFromChat(answer, usage, labels);
    expect(thinkResponseSchema.safeParse(res).success).toBe(true);
    expect(res).toEqual({
      id: "think_1",
      object: "think",
      created: 1_700_000_000,
      model: "tollgate-reasoner",
      answer: "42",
      reasoning: "six times seven",
      finish_reason: "stop",
      usage: { input_tokens: 11, output_tokens: 9, reasoning_tokens: 4, total_tokens: 20 },
    });
  });

  it("reads reasoning from the `reasoning` field too, and answers reasoning: null when there is none", () => {
    const withReasoning = readChatAnswer({ choices: [{ message: { content: "a", reasoning: "r" } }] });
    expect(thinkFromChat(withReasoning, usage, labels).reasoning).toBe("r");
    const none = readChatAnswer({ choices: [{ message: { content: "a" }, finish_reason: "stop" }] });
    const res = thinkFromChat(none, usage, labels);
    expect(res.reasoning).toBeNull();
    expect(res.created).toBe(5);
  });
});

describe("the domain's shapes and the wire schemas", () => {
  it("a parsed request is a ThinkRequest, a ThinkResponse fits the response schema (checked by tsc)", () => {
    expectTypeOf<WireThinkRequest>().toExtend<ThinkRequest>();
    expectTypeOf<ThinkResponse>().toExtend<WireThinkResponse>();
  });
});
