import type { AllInOne } from "@tollgate/all-in-one";
import type { FakeUpstream } from "@tollgate/testkit/fake-upstream";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Books } from "./books.js";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const KEY = "tg_test_responses_stream_0123456789abcdef";
const BUDGET = 10n ** 9n;

/** The `x_tollgate` extension the gateway puts on a stream's final event. */
type XTollgate = { cost: string; budget_remaining: string };

/**
 * POST /v1/responses with `stream: true` through the official openai SDK, as a user's code
 * streams it (`responses.create({ stream: true })` and `responses.stream()`), against the
 * all-in-one gateway: the text and usage come through, and every stream, finished or cut, is
 * billed as a chat stream is. The books are checked after each case: what callers were told ==
 * what metering recorded == what the budget lost, no hold left.
 */
describe("POST /v1/responses streamed to the openai SDK (all-in-one, in process)", () => {
  let running: ConfiguredGateway;
  let gateway: AllInOne;
  let upstream: FakeUpstream;
  let books: Books;
  let client: OpenAI;

  beforeAll(async () => {
    running = await startConfiguredGateway(
      (url) => `
upstreams: [{ id: fake, baseUrl: "${url}" }]
models:
  - { id: m, upstream: fake, upstreamModel: fake-small, runtime: vllm, pricing: { inputPerMillion: 1000000, outputPerMillion: 3000000 } }
accounts:
  - id: acct
    connections:
      - id: conn
        models: [m]
        defaultModel: m
        policy: { defaultMaxOutputTokens: 64, maxOutputTokens: 256 }
        budget: { amount: ${BUDGET} }
        keys: [{ id: k, secret: ${KEY} }]
`,
      { upstream: { outputTokens: 40 } },
    );
    ({ gateway, upstream } = running);
    books = new Books(gateway, { id: "acct", key: KEY, budget: BUDGET });
    client = new OpenAI({ baseURL: `${gateway.url}/v1`, apiKey: KEY, maxRetries: 0 });
  });

  afterAll(async () => {
    books?.close();
    await running?.stop();
  });

  afterEach(async () => {
    upstream.configure({ tokensPerSecond: 0 });
    await books.check();
  }, 60_000);

  it("streams responses.create({ stream: true }): the Responses events in order, the text, usage and cost", async () => {
    const stream = await client.responses.create({
      model: "m",
      input: "Say something",
      max_output_tokens: 12,
      stream: true,
    });
    const types: string[] = [];
    const sequence: number[] = [];
    let text = "";
    let final: OpenAI.Responses.Response | undefined;
    let money: XTollgate | undefined;
    for await (const event of stream) {
      types.push(event.type);
      sequence.push(event.sequence_number);
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.completed" || event.type === "response.incomplete") {
        final = event.response;
        money = (event as unknown as { x_tollgate: XTollgate }).x_tollgate;
      }
    }
    expect(types.slice(0, 4)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
    ]);
    expect(types.slice(-4)).toEqual([
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.incomplete",
    ]);
    // One delta per token the upstream produced (it streams one token a chunk).
    expect(types.filter((t) => t === "response.output_text.delta")).toHaveLength(12);
    expect(sequence).toEqual(sequence.map((_, i) => i));
    expect(final?.status).toBe("incomplete");
    expect(final?.incomplete_details?.reason).toBe("max_output_tokens");
    expect(final?.output_text).toBe(text);
    expect(text.length).toBeGreaterThan(0);
    expect(final?.usage?.output_tokens).toBe(12);
    expect(final?.usage?.total_tokens).toBe((final?.usage?.input_tokens ?? 0) + 12);
    expect(money?.cost).toMatch(/^[1-9]\d*$/);
    books.tell(BigInt(money!.cost));
    const totals = await books.totals();
    expect(Number(totals?.outputTokens)).toBe(12);
    expect(Number(totals?.inputTokens)).toBe(final?.usage?.input_tokens);
  });

  it("streams responses.stream(): the SDK assembles the final response; a finished answer is completed", async () => {
    const stream = client.responses.stream({
      model: "m",
      instructions: "Be brief.",
      input: [{ role: "user", content: [{ type: "input_text", text: "Say something" }] }],
    });
    let deltas = "";
    let money: XTollgate | undefined;
    stream.on("response.output_text.delta", (e) => {
      deltas += e.delta;
    });
    stream.on("response.completed", (e) => {
      money = (e as unknown as { x_tollgate: XTollgate }).x_tollgate;
    });
    const response = await stream.finalResponse();
    expect(response.status).toBe("completed");
    expect(response.output_text).toBe(deltas);
    // The upstream's whole answer (40 tokens) is under the policy's default cap of 64.
    expect(response.usage?.output_tokens).toBe(40);
    expect(money?.cost).toMatch(/^[1-9]\d*$/);
    books.tell(BigInt(money!.cost));
  });

  it("ends a stream whose upstream dies mid-way with response.failed, billed for what was produced", async () => {
    upstream.failNext(1, { afterChunks: 3 });
    const before = await books.totals();
    const stream = await client.responses.create({
      model: "m",
      input: "Say something",
      max_output_tokens: 30,
      stream: true,
    });
    const types: string[] = [];
    let failed: OpenAI.Responses.Response | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "response.failed") failed = event.response;
    }
    expect(types.filter((t) => t === "response.output_text.delta")).toHaveLength(3);
    expect(types.at(-1)).toBe("response.failed");
    expect(types).not.toContain("response.completed");
    expect(failed?.status).toBe("failed");
    expect(failed?.error?.code).toBe("upstream_error");
    expect(await books.billedUntold(before)).toBeGreaterThan(0n);
    const after = await books.totals();
    // The three tokens produced before the cut, as a cut chat stream is billed.
    expect(Number((after?.outputTokens ?? 0n) - (before?.outputTokens ?? 0n))).toBe(3);
  });

  it("bills a stream its caller leaves mid-way for the tokens produced, and leaves no hold", async () => {
    upstream.configure({ tokensPerSecond: 10 });
    const before = await books.totals();
    const stream = await client.responses.create({
      model: "m",
      input: "Say something",
      max_output_tokens: 40,
      stream: true,
    });
    let deltas = 0;
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") deltas += 1;
      // Leaving the loop aborts the request: the caller goes away.
      if (deltas === 2) break;
    }
    const cost = await books.billedUntold(before);
    const after = await books.totals();
    const produced = Number((after?.outputTokens ?? 0n) - (before?.outputTokens ?? 0n));
    expect(produced).toBeGreaterThanOrEqual(2);
    expect(produced).toBeLessThan(40);
    expect(cost).toBeGreaterThan(0n);
  });
});
