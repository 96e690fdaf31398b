import { describe, expect, it } from "vitest";
import { completionRequestSchema } from "./completions.js";

const ok = (body: unknown) => completionRequestSchema.safeParse(body).success;

describe("completionRequestSchema", () => {
  it("takes a prompt string or a list of strings, with the legacy fields", () => {
    expect(ok({ prompt: "Once upon", max_tokens: 5, temperature: 0, stop: "\n" })).toBe(true);
    expect(
      ok({ prompt: ["a", "b"], stop: ["x", "y"], stream: true, stream_options: { include_usage: true } }),
    ).toBe(true);
  });

  it("refuses a missing prompt, token-id prompts, an empty list and more than four stops", () => {
    expect(ok({ max_tokens: 5 })).toBe(false);
    expect(ok({ prompt: [1, 2, 3] })).toBe(false);
    expect(ok({ prompt: [] })).toBe(false);
    expect(ok({ prompt: "x", stop: ["1", "2", "3", "4", "5"] })).toBe(false);
    expect(ok({ prompt: "x", max_tokens: 0 })).toBe(false);
  });

  it("names the limit when a prompt list is too long", () => {
    const r = completionRequestSchema.safeParse({ prompt: Array.from({ length: 2049 }, () => "x") });
    expect(r.success).toBe(false);
    expect(r.error?.issues[0]?.message).toBe("prompt must be a string or a list of 1 to 2048 strings");
  });

  it("passes other fields through to the upstream", () => {
    expect(completionRequestSchema.parse({ prompt: "x", n: 2, echo: false })).toMatchObject({
      n: 2,
      echo: false,
    });
  });
});
