import { ERRORS, type ErrorSpec } from "@tollgate/proto/errors";
import { describe, expect, it } from "vitest";
import { messagesRequestSchema } from "../schemas/messages.js";
import { anthropicErrorType, chatBodyFromMessages, stopReasonOf } from "./messages.js";

/** Anthropic's documented error types. */
const ANTHROPIC_TYPES = [
  "invalid_request_error",
  "authentication_error",
  "billing_error",
  "permission_error",
  "not_found_error",
  "request_too_large",
  "rate_limit_error",
  "timeout_error",
  "api_error",
  "overloaded_error",
];

describe("the Messages translation", () => {
  it("gives every status of the error table one of Anthropic's error types, 4xx and 5xx apart", () => {
    for (const [code, spec] of Object.entries(ERRORS) as [string, ErrorSpec][]) {
      if (typeof spec.http !== "number") continue;
      const type = anthropicErrorType(spec.http);
      expect(ANTHROPIC_TYPES, code).toContain(type);
      if (spec.http >= 500) expect(["api_error", "overloaded_error", "timeout_error"], code).toContain(type);
    }
  });

  it("maps finish reasons to stop reasons", () => {
    expect([
      stopReasonOf("stop"),
      stopReasonOf("length"),
      stopReasonOf("content_filter"),
      stopReasonOf(null),
    ]).toEqual(["end_turn", "max_tokens", "refusal", null]);
  });

  it("caps the chat request at the grant's cap when it is smaller than max_tokens, and drops an empty system", () => {
    const req = messagesRequestSchema.parse({
      max_tokens: 500,
      system: "",
      messages: [{ role: "user", content: "hi" }],
    });
    expect(chatBodyFromMessages(req, "m", 100)).toEqual({
      model: "m",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 100,
    });
  });

  it("accepts thinking when disabled, and an empty tools list", () => {
    const ok = messagesRequestSchema.safeParse({
      max_tokens: 5,
      thinking: { type: "disabled" },
      tools: [],
      messages: [{ role: "user", content: "hi" }],
    });
    expect(ok.success).toBe(true);
  });
});
