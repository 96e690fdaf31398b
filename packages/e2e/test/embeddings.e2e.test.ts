import { readFileSync } from "node:fs";
import { inputBoundOf, loadGatewayConfig, quoteOf } from "@tollgate/config";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { MeteringService, type UsageTotals } from "@tollgate/proto/metering";
import { embeddingInputTokens, fakeEmbedding } from "@tollgate/testkit/fake-upstream";
import { DEMO_CONFIG } from "@tollgate/testkit/stack";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

/**
 * POST /v1/embeddings on the all-in-one, through the official openai SDK as LangChain and
 * LlamaIndex call it (`client.embeddings.create`, base64 by the SDK's default): the vectors are the
 * fake upstream's for each input, usage is the upstream's prompt tokens, the quote is the input
 * bound alone, and the books agree: told == budget spent == metered, no hold left, budget never
 * negative. A key whose connection does not allow the route gets route_not_allowed.
 */

const MODEL = "tollgate-embed-mini";
const UPSTREAM_MODEL = "fake-embed";
const CONFIG = loadGatewayConfig(DEMO_CONFIG);
const EMBED = CONFIG.models.find((m) => m.id === MODEL)!;
const BUDGET = 1_000_000n;
const KEY = "tg_test_embed_budgeted_0123456789abcdef";
const CHAT_ONLY_KEY = "tg_test_embed_chatonly_0123456789abcdef";

/** The demo configuration with a budgeted embeddings account and a chat-only connection. */
function withAccounts(yaml: string): string {
  return `${yaml.trimEnd()}
  - id: embed-budgeted
    connections:
      - id: embed-conn
        models: [${MODEL}, tollgate-mini]
        defaultModel: ${MODEL}
        budget: { amount: ${BUDGET} }
        keys: [{ id: embed-key, secret: ${KEY} }]
      - id: chat-only
        models: [${MODEL}, tollgate-mini]
        defaultModel: tollgate-mini
        routes: [models, chat]
        keys: [{ id: chat-only-key, secret: ${CHAT_ONLY_KEY} }]
`;
}

describe("POST /v1/embeddings on the all-in-one, through the openai SDK", () => {
  let running: ConfiguredGateway;
  let client: OpenAI;
  let metering: Client<MethodsOf<typeof MeteringService>>;
  /** What the caller was told it spent, and how many requests were served. */
  let told = 0n;
  let served = 0;

  beforeAll(async () => {
    const demo = readFileSync(DEMO_CONFIG, "utf8");
    running = await startConfiguredGateway(
      (url) => withAccounts(demo.replace("http://127.0.0.1:18000/v1", url)),
      {
        upstream: { record: true },
      },
    );
    client = new OpenAI({ baseURL: `${running.gateway.url}/v1`, apiKey: KEY, maxRetries: 0 });
    metering = createClient(
      MeteringService,
      running.gateway.meteringAddr,
      running.gateway.internalAuth("api-edge"),
    );
  }, 90_000);

  afterAll(async () => {
    metering?.$close();
    await running?.stop();
  });

  /** One embeddings call through the SDK, its money headers counted as the caller sees them. */
  async function embed(params: OpenAI.EmbeddingCreateParams) {
    const { data, response } = await client.embeddings.create(params).withResponse();
    const cost = BigInt(response.headers.get("x-tollgate-cost") ?? "-1");
    const left = response.headers.get("x-tollgate-budget-remaining");
    told += cost;
    served += 1;
    return { data, cost, remaining: left === null ? undefined : BigInt(left), response };
  }

  /** The upstream's body of the last request it received. */
  const lastUpstreamBody = () => running.upstream.requests.at(-1)?.body as Record<string, unknown>;

  it("embeds one input: the upstream's vector, its prompt tokens as usage, charged per input token", async () => {
    const input = "Tollgate meters every token it serves";
    const body = JSON.stringify({ model: MODEL, input, encoding_format: "base64" });
    const { data, cost, remaining } = await embed({ model: MODEL, input });
    expect(data.object).toBe("list");
    expect(data.model).toBe(MODEL);
    expect(data.data).toHaveLength(1);
    expect(data.data[0]?.index).toBe(0);
    // The SDK asked for base64 and decoded the float32s: exactly the fake's vector.
    expect(data.data[0]?.embedding).toEqual(fakeEmbedding(UPSTREAM_MODEL, input, 256));
    expect(lastUpstreamBody()).toEqual({ model: UPSTREAM_MODEL, input, encoding_format: "base64" });
    const tokens = embeddingInputTokens(input);
    expect(data.usage).toEqual({ prompt_tokens: tokens, total_tokens: tokens });
    const expectedCost = (BigInt(tokens) * EMBED.pricing.inputPerMillion + 999_999n) / 1_000_000n;
    expect(cost).toBe(expectedCost);
    // The quote is the input bound alone (no output), and what is charged stays under it.
    const quote = quoteOf(Buffer.byteLength(body), 1, 0, EMBED.pricing);
    expect(quote).toBe((BigInt(inputBoundOf(Buffer.byteLength(body), 1)) * 20_000n + 999_999n) / 1_000_000n);
    expect(cost).toBeLessThanOrEqual(quote);
    expect(remaining).toBe(BUDGET - told);
  });

  it("embeds a batch in input order, with dimensions and float encoding honoured", async () => {
    const inputs = ["alpha", "beta", "gamma"];
    const { data, remaining } = await embed({
      model: MODEL,
      input: inputs,
      dimensions: 32,
      encoding_format: "float",
    });
    expect(data.data.map((d) => d.index)).toEqual([0, 1, 2]);
    data.data.forEach((d, i) => {
      expect(d.embedding).toHaveLength(32);
      // float encoding passes JSON numbers through: the fake's float32 values exactly.
      expect(d.embedding).toEqual(fakeEmbedding(UPSTREAM_MODEL, inputs[i]!, 32));
    });
    const tokens = inputs.reduce((s, i) => s + embeddingInputTokens(i), 0);
    expect(data.usage.prompt_tokens).toBe(tokens);
    expect(remaining).toBe(BUDGET - told);
  });

  it("embeds token-id inputs, counted one token per id", async () => {
    const { data } = await embed({
      model: MODEL,
      input: [
        [101, 2023, 102],
        [7, 8],
      ],
    });
    expect(data.data).toHaveLength(2);
    expect(data.usage.prompt_tokens).toBe(5);
  });

  it("refuses a chat model on the route, and an embedding model on chat, with model_kind_mismatch, charging nothing", async () => {
    const wrong = await client.embeddings
      .create({ model: "tollgate-mini", input: "x" })
      .catch((e: unknown) => e);
    expect(wrong).toBeInstanceOf(OpenAI.APIError);
    expect((wrong as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((wrong as InstanceType<typeof OpenAI.APIError>).code).toBe("model_kind_mismatch");
    const chat = await client.chat.completions
      .create({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 4 })
      .catch((e: unknown) => e);
    expect((chat as InstanceType<typeof OpenAI.APIError>).status).toBe(400);
    expect((chat as InstanceType<typeof OpenAI.APIError>).code).toBe("model_kind_mismatch");
  });

  it("refuses more than 2048 inputs with 400 before anything is held", async () => {
    const res = await fetch(`${running.gateway.url}/v1/embeddings`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, input: Array.from({ length: 2049 }, () => "x") }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("invalid_request");
  });

  it("answers 403 route_not_allowed to a key whose connection does not allow embeddings", async () => {
    const chatOnly = new OpenAI({
      baseURL: `${running.gateway.url}/v1`,
      apiKey: CHAT_ONLY_KEY,
      maxRetries: 0,
    });
    const err = await chatOnly.embeddings.create({ model: MODEL, input: "x" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(403);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe("route_not_allowed");
  });

  it("keeps the books: told == budget spent == metered, no hold left, budget never negative", async () => {
    let totals: UsageTotals | undefined;
    const deadline = Date.now() + 20_000;
    do {
      totals = await metering.getUsage({ accountId: "embed-budgeted" }).then((r) => r.totals);
      if (Number(totals?.requests ?? 0n) >= served) break;
      await new Promise((r) => setTimeout(r, 100));
    } while (Date.now() < deadline);
    expect(Number(totals?.requests)).toBe(served);
    expect(BigInt(totals?.cost ?? "-1")).toBe(told);
    expect(Number(totals?.outputTokens)).toBe(0);
    // Settlements land right after metering records; a probe then sees exactly what was told.
    await new Promise((r) => setTimeout(r, 200));
    const before = told;
    const probe = await embed({ model: MODEL, input: "probe" });
    expect(probe.remaining).toBe(BUDGET - before - probe.cost);
    expect(probe.remaining!).toBeGreaterThanOrEqual(0n);
  }, 60_000);
});
