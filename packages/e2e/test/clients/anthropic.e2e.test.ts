import Anthropic, { type APIError } from "@anthropic-ai/sdk";
import { describe, expect, it } from "vitest";
import {
  KEYS,
  MODEL,
  REFUSALS,
  type Refusal,
  rejection,
  UPSTREAM_OUTPUT_TOKENS,
  useClientGateway,
} from "./fixture.js";

/** The `x_tollgate` extension the gateway puts on a stream's `message_delta`. */
type XTollgate = { cost: string; budget_remaining: string };

/**
 * POST /v1/messages through the official Anthropic SDK, pointed at the all-in-one gateway with a
 * Virtual Key as its API key (SDK 1.x sends it as `Authorization: Bearer`; `x-api-key`, as older
 * SDKs and other Anthropic clients send it, is tested too): buffered and streamed answers with their text
 * and usage, Anthropic-shaped errors the SDK raises as its own error classes (one per status,
 * 402 included), and streams cut either way billed as chat streams are. The books of every
 * account used are checked after each case: what callers were told == what metering recorded ==
 * what the budget lost, no hold left.
 */
describe("POST /v1/messages with the Anthropic SDK (all-in-one, in process)", () => {
  const gateway = useClientGateway();
  const sdk = (key: string = KEYS.served) =>
    new Anthropic({ baseURL: gateway().url, apiKey: key, maxRetries: 0, fetch: gateway().wire.fetch });

  /** A buffered message, its cost as the caller was told it (x-tollgate-cost). */
  async function buffered(params: Anthropic.MessageCreateParamsNonStreaming) {
    const { data, response, request_id } = await sdk().messages.create(params).withResponse();
    return {
      message: data,
      requestId: request_id,
      cost: BigInt(response.headers.get("x-tollgate-cost") ?? "-1"),
    };
  }

  it("answers messages.create with a message: text, stop reason, usage, and its cost", async () => {
    const { message, requestId, cost } = await buffered({
      model: MODEL,
      max_tokens: 8,
      system: "Be brief.",
      messages: [{ role: "user", content: [{ type: "text", text: "Say something" }] }],
    });
    expect(message.type).toBe("message");
    expect(message.role).toBe("assistant");
    expect(message.id).toMatch(/^msg_/);
    // The SDK's own handle on the request id, for a support ticket.
    expect(requestId).toMatch(/.+/);
    expect(message.model).toBe(MODEL);
    expect(message.stop_reason).toBe("max_tokens");
    expect(message.stop_sequence).toBeNull();
    expect(message.content).toHaveLength(1);
    const block = message.content[0]!;
    expect(block.type === "text" && block.text.length > 0).toBe(true);
    expect(message.usage.output_tokens).toBe(8);
    expect(message.usage.input_tokens).toBeGreaterThan(0);
    expect(cost).toBeGreaterThan(0n);
    // The upstream got one chat request: the system first, max_tokens as its cap.
    const sent = gateway().upstream.requests.at(-1)?.body as {
      messages: { role: string }[];
      max_tokens: number;
    };
    expect(sent.messages.map((m) => m.role)).toEqual(["system", "user"]);
    expect(sent.max_tokens).toBe(8);
  });

  it("answers the key sent as x-api-key (older SDKs, Anthropic's other clients) as it answers Bearer", async () => {
    const headerOnly = new Anthropic({
      baseURL: gateway().url,
      apiKey: null,
      defaultHeaders: { "x-api-key": KEYS.served },
      maxRetries: 0,
      fetch: gateway().wire.fetch,
    });
    const { data, response } = await headerOnly.messages
      .create({ model: MODEL, max_tokens: 4, messages: [{ role: "user", content: "Hi" }] })
      .withResponse();
    expect(data.type).toBe("message");
    expect(BigInt(response.headers.get("x-tollgate-cost") ?? "0")).toBeGreaterThan(0n);
  });

  it("answers a conversation whose earlier answer goes back as the assistant turn", async () => {
    const user = { role: "user" as const, content: "Hello" };
    const first = await buffered({ model: MODEL, max_tokens: 4, messages: [user] });
    const second = await buffered({
      model: MODEL,
      max_tokens: 4,
      messages: [
        user,
        { role: "assistant", content: first.message.content },
        { role: "user", content: "Again" },
      ],
    });
    expect(second.message.usage.output_tokens).toBe(4);
    expect(second.message.usage.input_tokens).toBeGreaterThan(first.message.usage.input_tokens);
    const said = first.message.content[0]?.type === "text" ? first.message.content[0].text : "";
    expect(JSON.stringify(gateway().upstream.requests.at(-1)?.body)).toContain(said.trim());
  });

  it("streams messages.create({ stream: true }): Anthropic's events, the text, usage and cost", async () => {
    const stream = await sdk().messages.create({
      model: MODEL,
      max_tokens: 12,
      messages: [{ role: "user", content: "Say something" }],
      stream: true,
    });
    const types: string[] = [];
    let text = "";
    let usage: Anthropic.MessageDeltaUsage | undefined;
    let stopReason: string | null | undefined;
    let money: XTollgate | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") text += event.delta.text;
      if (event.type === "message_delta") {
        usage = event.usage;
        stopReason = event.delta.stop_reason;
        money = (event as unknown as { x_tollgate: XTollgate }).x_tollgate;
      }
    }
    expect(types[0]).toBe("message_start");
    expect(types[1]).toBe("content_block_start");
    expect(types.slice(-3)).toEqual(["content_block_stop", "message_delta", "message_stop"]);
    // One delta per token the upstream produced (it streams one token a chunk).
    expect(types.filter((t) => t === "content_block_delta")).toHaveLength(12);
    expect(text.length).toBeGreaterThan(0);
    expect(stopReason).toBe("max_tokens");
    expect(usage?.output_tokens).toBe(12);
    expect(usage?.input_tokens).toBeGreaterThan(0);
    expect(money?.cost).toMatch(/^[1-9]\d*$/);
    // The books were told the cost the SDK's event carries.
    expect(gateway().wire.last().cost).toBe(BigInt(money!.cost));
  });

  it("streams messages.stream(): the SDK assembles the final message, its usage included", async () => {
    let money: XTollgate | undefined;
    let deltas = "";
    const stream = sdk()
      .messages.stream({
        model: MODEL,
        max_tokens: 100,
        messages: [{ role: "user", content: "Say something" }],
      })
      .on("text", (delta) => {
        deltas += delta;
      })
      .on("streamEvent", (event) => {
        if (event.type === "message_delta")
          money = (event as unknown as { x_tollgate: XTollgate }).x_tollgate;
      });
    const message = await stream.finalMessage();
    expect(message.stop_reason).toBe("end_turn");
    const block = message.content[0]!;
    expect(block.type === "text" ? block.text : "").toBe(deltas);
    // The upstream's whole answer is under max_tokens.
    expect(message.usage.output_tokens).toBe(UPSTREAM_OUTPUT_TOKENS);
    expect(message.usage.input_tokens).toBeGreaterThan(0);
    expect(gateway().wire.last().cost).toBe(BigInt(money!.cost));
  });

  /** The SDK's error for `refusal`: its class for the status, Anthropic's error type, our code. */
  async function expectRefused(refusal: Refusal, stream: boolean) {
    // The SDK requires max_tokens: the cap the connection would default to.
    const params = {
      model: refusal.model,
      max_tokens: refusal.cap,
      messages: [{ role: "user" as const, content: "hi" }],
    };
    const err = await rejection(
      stream
        ? sdk(refusal.key)
            .messages.create({ ...params, stream: true })
            .then(async (s) => {
              for await (const _ of s);
            })
        : sdk(refusal.key).messages.create(params),
    );
    const [expected, type] = {
      401: [Anthropic.AuthenticationError, "authentication_error"],
      402: [Anthropic.PaymentRequiredError, "billing_error"],
      403: [Anthropic.PermissionDeniedError, "permission_error"],
      429: [Anthropic.RateLimitError, "rate_limit_error"],
    }[refusal.status];
    expect(err).toBeInstanceOf(expected);
    expect((err as APIError).status).toBe(refusal.status);
    expect((err as APIError).error).toMatchObject({ type: "error", error: { type, code: refusal.code } });
    expect((err as APIError).requestID).toMatch(/.+/);
  }

  it("raises the SDK's own error classes for 401, 402, 403 and 429, buffered and streamed", async () => {
    await gateway().fillRateLimit();
    for (const refusal of Object.values(REFUSALS)) {
      await expectRefused(refusal, false);
      await expectRefused(refusal, true);
    }
  });

  it("raises the SDK's own errors for what the route does not take, holding and billing nothing", async () => {
    const tools = await sdk()
      .messages.create({
        model: MODEL,
        max_tokens: 8,
        tools: [{ name: "lookup", input_schema: { type: "object" } }],
        messages: [{ role: "user", content: "hi" }],
      })
      .catch((err: unknown) => err);
    expect(tools).toBeInstanceOf(Anthropic.BadRequestError);
    expect((tools as APIError).error).toMatchObject({
      error: { type: "invalid_request_error", message: expect.stringMatching(/tools are not supported/) },
    });

    const image = await sdk()
      .messages.create({
        model: MODEL,
        max_tokens: 8,
        messages: [
          {
            role: "user",
            content: [
              { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
            ],
          },
        ],
      })
      .catch((err: unknown) => err);
    expect(image).toBeInstanceOf(Anthropic.BadRequestError);

    const overCap = await sdk()
      .messages.create({ model: MODEL, max_tokens: 1000, messages: [{ role: "user", content: "hi" }] })
      .catch((err: unknown) => err);
    expect(overCap).toBeInstanceOf(Anthropic.PermissionDeniedError);
    expect((overCap as APIError).error).toMatchObject({
      error: { type: "permission_error", code: "output_cap_above_policy" },
    });
  });

  it("raises an error event on a stream whose upstream dies mid-way, billed for what was produced and told so", async () => {
    gateway().upstream.failNext(1, { afterChunks: 3 });
    const cut = await gateway().cutStream();
    const stream = await sdk().messages.create({
      model: MODEL,
      max_tokens: 30,
      messages: [{ role: "user", content: "Say something" }],
      stream: true,
    });
    let deltas = 0;
    const failure = await (async () => {
      for await (const event of stream) if (event.type === "content_block_delta") deltas += 1;
    })().catch((err: unknown) => err);
    expect(deltas).toBe(3);
    expect(failure).toBeInstanceOf(Anthropic.APIError);
    expect((failure as APIError).error).toMatchObject({
      type: "error",
      error: { type: "api_error", code: "upstream_error" },
    });
    const billed = await cut.billed();
    expect(billed.cost).toBeGreaterThan(0n);
    // The error event carried the cost (x_tollgate): exactly what metering billed.
    expect(billed.told).toBe(true);
    expect(billed.outputTokens).toBe(3);
  });

  it("bills a stream its caller leaves mid-way for the tokens produced, and leaves no hold", async () => {
    gateway().upstream.configure({ tokensPerSecond: 10 });
    const cut = await gateway().cutStream();
    const stream = await sdk().messages.create({
      model: MODEL,
      max_tokens: 40,
      messages: [{ role: "user", content: "Say something" }],
      stream: true,
    });
    let deltas = 0;
    for await (const event of stream) {
      if (event.type === "content_block_delta") deltas += 1;
      // Leaving the loop aborts the request: the caller goes away.
      if (deltas === 2) break;
    }
    const billed = await cut.billed();
    expect(billed.cost).toBeGreaterThan(0n);
    expect(billed.outputTokens).toBeGreaterThanOrEqual(2);
    expect(billed.outputTokens).toBeLessThan(40);
  });
});
