import Anthropic from "@anthropic-ai/sdk";
import type { AllInOne } from "@tollgate/all-in-one";
import { costOf } from "@tollgate/config";
import { expectedOutput, type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import type { LogCapture } from "@tollgate/testkit/logs";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Books } from "./books.js";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const KEY = "tg_test_anthropic_upstream_0123456789abcdef";
const UPSTREAM_KEY = "sk-ant-e2e-upstream-key";
const BUDGET = 10n ** 9n;
const PRICES = { inputPerMillion: 1_000_000n, outputPerMillion: 3_000_000n };

/** The `x_tollgate` extension the gateway puts on a stream's last event. */
type XTollgate = { cost: string; budget_remaining: string };

/**
 * A model served by an `anthropic`-kind upstream (the fake's POST /v1/messages), on the
 * all-in-one in process: chat buffered and streamed through the openai SDK, /v1/messages
 * through the Anthropic SDK, a refused parameter, failover from an upstream answering 529
 * (overloaded) to a second upstream, and streams cut short. Usage is the upstream's, priced
 * exactly; the books are checked after each case: what callers were told == what metering
 * recorded == what the budget lost, no hold left.
 */
describe("a model served by an Anthropic Messages API upstream (all-in-one, in process)", () => {
  let running: ConfiguredGateway;
  let gateway: AllInOne;
  let claude: FakeUpstream;
  let backup: FakeUpstream;
  let logs: LogCapture;
  let books: Books;
  let openai: OpenAI;
  let anthropic: Anthropic;

  beforeAll(async () => {
    // The second upstream first: the gateway's own fake (the yaml's `url`) is the Anthropic one.
    backup = await startFakeUpstream({ outputTokens: 20, record: true });
    const pricing = `pricing: { inputPerMillion: ${PRICES.inputPerMillion}, outputPerMillion: ${PRICES.outputPerMillion} }`;
    running = await startConfiguredGateway(
      (url) => `
upstreams:
  - { id: claude, kind: anthropic, baseUrl: "${url.replace(/\/v1$/, "")}", apiKeyEnv: E2E_ANTHROPIC_KEY }
  - { id: backup, baseUrl: "${backup.url}" }
resilience: { retry: { maxAttempts: 2, baseBackoffMs: 1, maxBackoffMs: 5 } }
models:
  - { id: c, upstream: claude, upstreamModel: fake-small, runtime: anthropic, ${pricing} }
  - id: c-ha
    upstreams: [{ id: claude, priority: 0 }, { id: backup, priority: 1 }]
    upstreamModel: fake-small
    runtime: anthropic
    ${pricing}
accounts:
  - id: acct
    connections:
      - id: conn
        models: [c, c-ha]
        defaultModel: c
        policy: { defaultMaxOutputTokens: 64, maxOutputTokens: 256 }
        budget: { amount: ${BUDGET} }
        keys: [{ id: k, secret: ${KEY} }]
`,
      {
        upstream: { apiKey: UPSTREAM_KEY, outputTokens: 20, record: true },
        env: { E2E_ANTHROPIC_KEY: UPSTREAM_KEY },
      },
    );
    ({ gateway, upstream: claude, logs } = running);
    books = new Books(gateway, { id: "acct", key: KEY, budget: BUDGET });
    openai = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: KEY, maxRetries: 0 });
    anthropic = new Anthropic({ baseURL: gateway.url, apiKey: KEY, maxRetries: 0 });
  });

  afterAll(async () => {
    books?.close();
    await running?.stop();
    await backup?.close();
  });

  afterEach(async () => {
    claude.configure({ tokensPerSecond: 0 });
    await books.check();
  }, 60_000);

  const MESSAGES = [
    { role: "system" as const, content: "Be brief." },
    { role: "user" as const, content: "Tell me about lighthouses" },
  ];
  /** What the fake answers this conversation with (its /v1/messages words and counts are chat's). */
  const expected = (maxTokens: number) =>
    expectedOutput({ model: "fake-small", messages: MESSAGES, max_tokens: maxTokens }, { outputTokens: 20 });
  const priced = (input: number, output: number) =>
    costOf({ inputTokens: input, outputTokens: output }, PRICES);
  /** A streamed chat completion read to its end: its text, finish reason, usage and told cost (booked). */
  async function streamChat(model: string, maxTokens: number) {
    const stream = await openai.chat.completions.create({
      model,
      max_tokens: maxTokens,
      messages: MESSAGES,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | undefined;
    let money: XTollgate | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) {
        usage = chunk.usage;
        money = (chunk as unknown as { x_tollgate: XTollgate }).x_tollgate;
      }
    }
    const cost = BigInt(money?.cost ?? "-1");
    books.tell(cost);
    return { text, finish, usage, cost };
  }
  const lastMessagesCall = () => claude.requests.filter((r) => r.path === "/v1/messages").at(-1)!;

  it("answers a buffered chat completion (openai SDK) from the Anthropic upstream, priced from its usage", async () => {
    const { data, response } = await openai.chat.completions
      .create({ model: "c", max_tokens: 8, messages: MESSAGES })
      .withResponse();
    const want = expected(8);
    expect(data.choices[0]?.message.content).toBe(want.texts[0]);
    expect(data.choices[0]?.finish_reason).toBe("length");
    expect(data.model).toBe("c");
    expect(data.usage).toMatchObject({ prompt_tokens: want.usage.prompt_tokens, completion_tokens: 8 });
    const cost = BigInt(response.headers.get("x-tollgate-cost") ?? "-1");
    expect(cost).toBe(priced(want.usage.prompt_tokens, 8));
    books.tell(cost);
    // The upstream got a Messages API call with its own key, the system prompt lifted out.
    const call = lastMessagesCall();
    expect(call.headers["x-api-key"]).toBe(UPSTREAM_KEY);
    expect(call.headers["anthropic-version"]).toBe("2023-06-01");
    expect(call.body).toEqual({
      model: "fake-small",
      max_tokens: 8,
      system: "Be brief.",
      messages: [{ role: "user", content: "Tell me about lighthouses" }],
    });
  });

  it("streams a chat completion (openai SDK): the text, the usage chunk, and its cost", async () => {
    const { text, finish, usage, cost } = await streamChat("c", 12);
    const want = expected(12);
    expect(text).toBe(want.texts[0]);
    expect(finish).toBe("length");
    expect(usage).toMatchObject({ prompt_tokens: want.usage.prompt_tokens, completion_tokens: 12 });
    expect(cost).toBe(priced(want.usage.prompt_tokens, 12));
    expect(lastMessagesCall().body).toMatchObject({ stream: true, max_tokens: 12 });
  });

  it("serves POST /v1/messages (Anthropic SDK) to the model, buffered and streamed", async () => {
    const { data, response } = await anthropic.messages
      .create({ model: "c", max_tokens: 100, system: "Be brief.", messages: [MESSAGES[1]!] })
      .withResponse();
    const want = expected(100);
    expect(data.stop_reason).toBe("end_turn");
    const block = data.content[0]!;
    expect(block.type === "text" ? block.text : "").toBe(want.texts[0]);
    expect(data.usage).toMatchObject({ input_tokens: want.usage.prompt_tokens, output_tokens: 20 });
    const cost = BigInt(response.headers.get("x-tollgate-cost") ?? "-1");
    expect(cost).toBe(priced(want.usage.prompt_tokens, 20));
    books.tell(cost);

    let money: XTollgate | undefined;
    const message = await anthropic.messages
      .stream({ model: "c", max_tokens: 5, system: "Be brief.", messages: [MESSAGES[1]!] })
      .on("streamEvent", (event) => {
        if (event.type === "message_delta")
          money = (event as unknown as { x_tollgate: XTollgate }).x_tollgate;
      })
      .finalMessage();
    expect(message.stop_reason).toBe("max_tokens");
    const streamed = message.content[0]!;
    expect(streamed.type === "text" ? streamed.text : "").toBe(expected(5).texts[0]);
    expect(message.usage.output_tokens).toBe(5);
    expect(BigInt(money!.cost)).toBe(priced(want.usage.prompt_tokens, 5));
    books.tell(BigInt(money!.cost));
  });

  it("refuses what the Messages API cannot do before any upstream call, billing nothing", async () => {
    const calls = claude.requests.length;
    const err = await openai.chat.completions
      .create({ model: "c", max_tokens: 8, n: 2, messages: MESSAGES })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const apiError = err as InstanceType<typeof OpenAI.APIError>;
    expect(apiError.status).toBe(400);
    expect(apiError.code).toBe("invalid_request");
    expect(apiError.message).toMatch(/Anthropic Messages API, which does not support more than one choice/);
    expect(claude.requests.length).toBe(calls);
  });

  it("fails over from an Anthropic upstream answering 529 (overloaded) to the next upstream, buffered and streamed", async () => {
    claude.failNext(2, { status: 529 });
    const backupCalls = backup.requests.length;
    const { data, response } = await openai.chat.completions
      .create({ model: "c-ha", max_tokens: 6, messages: MESSAGES })
      .withResponse();
    const want = expected(6);
    // The backup (an OpenAI-compatible fake) answered the same conversation with the same words.
    expect(data.choices[0]?.message.content).toBe(want.texts[0]);
    const cost = BigInt(response.headers.get("x-tollgate-cost") ?? "-1");
    expect(cost).toBe(priced(want.usage.prompt_tokens, 6));
    books.tell(cost);

    const streamed = await streamChat("c-ha", 6);
    expect(streamed.text).toBe(want.texts[0]);
    expect(streamed.cost).toBe(cost);
    expect(backup.requests.length - backupCalls).toBe(2);
    expect(backup.requests.at(-1)?.path).toBe("/v1/chat/completions");
  });

  it("fails over a stream whose Anthropic upstream sends an overloaded error event before any text", async () => {
    claude.failNext(1, { errorEvent: "overloaded_error" });
    const { text, cost } = await streamChat("c-ha", 4);
    expect(text).toBe(expected(4).texts[0]);
    expect(cost).toBe(priced(expected(4).usage.prompt_tokens, 4));
  });

  it("bills a stream its caller leaves mid-way: the exact input and the text it received", async () => {
    claude.configure({ tokensPerSecond: 20 });
    const before = await books.totals();
    const stream = await openai.chat.completions.create({
      model: "c",
      max_tokens: 20,
      messages: MESSAGES,
      stream: true,
      stream_options: { include_usage: true },
    });
    let pieces = 0;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta.content) pieces += 1;
      // Leaving the loop aborts the request: the caller goes away.
      if (pieces === 3) break;
    }
    const cost = await books.billedUntold(before);
    const after = await books.totals();
    const input = Number((after?.inputTokens ?? 0n) - (before?.inputTokens ?? 0n));
    const output = Number((after?.outputTokens ?? 0n) - (before?.outputTokens ?? 0n));
    // The input is the upstream's own count (message_start), not an estimate.
    expect(input).toBe(expected(20).usage.prompt_tokens);
    // One token per text chunk the router had, never more than the upstream wrote.
    expect(output).toBeGreaterThanOrEqual(3);
    expect(output).toBeLessThanOrEqual(claude.requests.at(-1)?.tokensWritten ?? 0);
    expect(cost).toBe(priced(input, output));
  });

  it("never logs the upstream's key or a prompt", () => {
    const text = logs.text();
    expect(text.length).toBeGreaterThan(0);
    expect(text).not.toContain(UPSTREAM_KEY);
    expect(text).not.toContain("lighthouses");
  });
});
