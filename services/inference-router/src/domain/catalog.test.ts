import type { ModelConfig } from "@tollgate/config";
import { describe, expect, it } from "vitest";
import { Catalog } from "./catalog.js";
import type { FailoverMember } from "./failover.js";
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
  kind: "chat",
};

describe("Catalog", () => {
  const providers = new Map([["a", provider("a")]]);

  it("hands the composer each upstream's own model id, and keeps the model's as the default", () => {
    const composed: FailoverMember[][] = [];
    const compose = (_model: string, members: FailoverMember[]) => {
      composed.push(members);
      return members[0]!.provider;
    };
    const own = new Catalog(
      [{ ...BASE, upstreams: [{ id: "a", priority: 0, weight: 1, upstreamModel: "vendor/small" }] }],
      providers,
      compose,
    );
    expect(composed[0]!.map((m) => m.upstreamModel)).toEqual(["vendor/small"]);
    expect(own.resolve("public-small").upstreamModel).toBe("org/small-7b");
    const shared = new Catalog([{ ...BASE, upstream: "a" }], providers);
    expect(shared.resolve("public-small").upstreamModel).toBe("org/small-7b");
    // Without a composer nothing would send the upstream its own id: refused at start.
    expect(
      () =>
        new Catalog(
          [{ ...BASE, upstreams: [{ id: "a", priority: 0, weight: 1, upstreamModel: "vendor/small" }] }],
          providers,
        ),
    ).toThrow("failover composer");
  });

  it("answers model_not_found for a model it does not serve", () => {
    const catalog = new Catalog([{ ...BASE, upstream: "a" }], providers);
    expect(() => catalog.resolve("other")).toThrow(expect.objectContaining({ code: "model_not_found" }));
  });
});
