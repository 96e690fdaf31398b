import { request } from "node:http";
import type { AllInOne } from "@tollgate/all-in-one";
import { costOf } from "@tollgate/config";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { MeteringService } from "@tollgate/proto/metering";
import type { FakeUpstream } from "@tollgate/testkit/fake-upstream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const KEY = "tg_test_streams_0123456789abcdef";
const PRICES = { inputPerMillion: 1_000_000n, outputPerMillion: 3_000_000n };

/**
 * Streams are billed for what the upstream produced (docs/contract.md, "Streaming"): with or without
 * include_usage, and when the caller walks away mid-stream.
 */
describe("stream billing (all-in-one, in process)", () => {
  let upstream: FakeUpstream;
  let gateway: AllInOne;
  let running: ConfiguredGateway;
  let metering: Client<MethodsOf<typeof MeteringService>>;

  beforeAll(async () => {
    // 2 tokens a second: the caller's abort reaches the upstream long before the next token, even
    // on a busy machine (at 4 a second, a CI run on a loaded 2-core machine once saw the abort
    // arrive after the next token was written: billed 3, produced 4).
    running = await startConfiguredGateway(
      (url) => `
upstreams: [{ id: fake, baseUrl: "${url}" }]
models:
  - { id: m, upstream: fake, upstreamModel: fake-small, runtime: vllm, pricing: { inputPerMillion: 1000000, outputPerMillion: 3000000 } }
accounts:
  - id: acct
    connections:
      - { id: conn, models: [m], defaultModel: m, keys: [{ id: k, secret: ${KEY} }] }
`,
      {
        upstream: { tokensPerSecond: 2, outputTokens: 40, record: true },
      },
    );
    ({ gateway, upstream } = running);
    metering = createClient(MeteringService, gateway.meteringAddr, gateway.internalAuth("api-edge"));
  });

  afterAll(async () => {
    metering?.$close();
    await running?.stop();
  });

  async function usage(expectedRequests: bigint) {
    for (let i = 0; i < 100; i++) {
      const totals = (await metering.getUsage({ accountId: "acct" })).totals;
      if (totals && totals.requests >= expectedRequests) return totals;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error("usage never arrived");
  }

  it("bills a stream the caller cut mid-way for exactly the tokens the upstream produced", async () => {
    const controller = new AbortController();
    const res = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "m",
        max_tokens: 40,
        stream: true,
        messages: [{ role: "user", content: "go" }],
      }),
      signal: controller.signal,
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = "";
    let contentChunks = 0;
    while (contentChunks < 3) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      contentChunks = (text.match(/"content":"[^"]+"/g) ?? []).length;
    }
    controller.abort();
    await reader.cancel().catch(() => {});

    const totals = await usage(1n);
    // Give the upstream time to show it stopped: at 2 tokens/s it would have written more.
    await new Promise((r) => setTimeout(r, 700));
    const produced = upstream.requests.at(-1)?.tokensWritten ?? -1;
    expect(produced).toBeGreaterThanOrEqual(3);
    expect(produced).toBeLessThan(40);
    expect(Number(totals.outputTokens)).toBe(produced);
    expect(totals.requests).toBe(1n);
    expect(BigInt(totals.cost)).toBe(
      costOf({ inputTokens: Number(totals.inputTokens), outputTokens: Number(totals.outputTokens) }, PRICES),
    );
  });

  it("records usage of a stream whose caller did not ask for include_usage, without sending it", async () => {
    upstream.configure({ tokensPerSecond: 0 });
    const before = (await metering.getUsage({ accountId: "acct" })).totals;
    const res = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "m",
        max_tokens: 7,
        stream: true,
        messages: [{ role: "user", content: "go" }],
      }),
    });
    const body = await res.text();
    expect(body).toContain("data: [DONE]");
    expect(body).not.toContain('"usage"');
    const after = await usage((before?.requests ?? 0n) + 1n);
    expect(after.outputTokens - (before?.outputTokens ?? 0n)).toBe(7n);
  });

  it("tells a stream's cost at its end: in the usage chunk when asked, and as HTTP trailers", async () => {
    upstream.configure({ tokensPerSecond: 0 });
    const body = JSON.stringify({
      model: "m",
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: "user", content: "go" }],
    });
    const url = new URL(`${gateway.url}/v1/chat/completions`);
    const { text, trailers } = await new Promise<{ text: string; trailers: NodeJS.Dict<string> }>(
      (resolve, reject) => {
        const req = request(
          url,
          { method: "POST", headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" } },
          (res) => {
            let text = "";
            res.setEncoding("utf8");
            res.on("data", (c: string) => {
              text += c;
            });
            res.on("end", () => resolve({ text, trailers: res.trailers }));
          },
        );
        req.on("error", reject);
        req.end(body);
      },
    );
    const events = text
      .split("\n\n")
      .filter((e) => e.startsWith("data: ") && e !== "data: [DONE]")
      .map(
        (e) =>
          JSON.parse(e.slice(6)) as { choices: unknown[]; usage?: unknown; x_tollgate?: { cost: string } },
      );
    const last = events.at(-1);
    expect(last?.choices).toEqual([]);
    expect(last?.x_tollgate?.cost).toMatch(/^\d+$/);
    expect(trailers["x-tollgate-cost"]).toBe(last?.x_tollgate?.cost);
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
  });
});
