import OpenAI, { NotFoundError } from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const KEYS = {
  small: "tg_test_retrieve_small_0123456789a",
  both: "tg_test_retrieve_both_0123456789ab",
};

// Two connections: one sees `small` only, the other both models.
const config = (upstreamUrl: string) => `
upstreams:
  - { id: fake, baseUrl: "${upstreamUrl}" }
models:
  - { id: small, upstream: fake, upstreamModel: fake-small, runtime: vllm, pricing: { inputPerMillion: 100000, outputPerMillion: 400000 } }
  - { id: large, upstream: fake, upstreamModel: fake-large, runtime: vllm, pricing: { inputPerMillion: 1000000, outputPerMillion: 4000000 } }
accounts:
  - id: acme
    connections:
      - id: acme-small
        models: [small]
        defaultModel: small
        keys:
          - { id: small-key, secret: ${KEYS.small} }
      - id: acme-both
        models: [small, large]
        defaultModel: small
        keys:
          - { id: both-key, secret: ${KEYS.both} }
`;

/** GET /v1/models/{model} through the official openai SDK, on the all-in-one gateway. */
describe("GET /v1/models/{model} with the openai SDK's models.retrieve", () => {
  let running: ConfiguredGateway;
  const client = (key: string) =>
    new OpenAI({ baseURL: `${running.gateway.url}/v1`, apiKey: key, maxRetries: 0 });

  beforeAll(async () => {
    running = await startConfiguredGateway(config);
  });

  afterAll(async () => {
    await running?.stop();
  });

  it("retrieves a model the key may use, as the list shows it, with its pricing", async () => {
    const sdk = client(KEYS.both);
    const model = await sdk.models.retrieve("large");
    expect(model).toMatchObject({ id: "large", object: "model", owned_by: "tollgate" });
    expect((model as unknown as { pricing: unknown }).pricing).toEqual({
      input_per_million: "1000000",
      output_per_million: "4000000",
      currency_decimals: 6,
    });
    const listed = [];
    for await (const m of sdk.models.list()) listed.push(m);
    expect(listed.find((m) => m.id === "large")).toEqual(model);
  });

  it("answers a model the key cannot see exactly as one that does not exist: 404", async () => {
    const sdk = client(KEYS.small);
    const refusals = [];
    for (const id of ["large", "no-such-model"]) {
      const err = await sdk.models.retrieve(id).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(NotFoundError);
      const e = err as NotFoundError;
      expect(e.status).toBe(404);
      expect(e.code).toBe("not_found");
      refusals.push({ message: e.message.replace(/request_id[^,}]*/, ""), type: e.type });
    }
    expect(refusals[0]).toEqual(refusals[1]);
  });

  it("answers 401 for a key the gateway does not know", async () => {
    const err = await client("tg_test_unknown_0123456789abcdef0")
      .models.retrieve("small")
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
  });
});
