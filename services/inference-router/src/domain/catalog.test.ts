import type { ModelConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { Catalog } from "./catalog.js";
import type { Provider } from "./ports.js";

const provider = (id: string): Provider => ({
  id,
  complete: async () => ({ json: {}, usage: undefined }),
  stream: async function* () {},
});

const BASE: ModelConfig = {
  id: "public-small",
  upstreamModel: "org/small-7b",
  runtime: "vllm",
  pricing: { inputPerMillion: 1n, outputPerMillion: 1n },
  maxOutputTokens: 4096,
  reasoning: false,
};

describe("Catalog", () => {
  const providers = new Map([["a", provider("a")]]);

  it("asks a model's one upstream for the model id it names, else the model's", () => {
    const own = new Catalog(
      [{ ...BASE, upstreams: [{ id: "a", priority: 0, weight: 1, upstreamModel: "vendor/small" }] }],
      providers,
    );
    expect(own.resolve("public-small").upstreamModel).toBe("vendor/small");
    const shared = new Catalog([{ ...BASE, upstream: "a" }], providers);
    expect(shared.resolve("public-small").upstreamModel).toBe("org/small-7b");
  });

  it("answers model_not_found for a model it does not serve", () => {
    const catalog = new Catalog([{ ...BASE, upstream: "a" }], providers);
    expect(() => catalog.resolve("other")).toThrow(expect.objectContaining({ code: "model_not_found" }));
  });
});
