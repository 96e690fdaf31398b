import type { AllInOne } from "@tollgate/all-in-one";
import type { FakeUpstream } from "@tollgate/testkit/fake-upstream";
import type { LogCapture } from "@tollgate/testkit/logs";
import { rawExchange } from "@tollgate/testkit/raw-http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ConfiguredGateway, startConfiguredGateway } from "./gateways.js";

const KEYS = {
  good: "tg_test_good_0123456789abcdef0123",
  limited: "tg_test_limited_0123456789abcdef",
  modelsOnly: "tg_test_models_only_0123456789ab",
  budgeted: "tg_test_budgeted_0123456789abcde",
  expired: "tg_test_expired_0123456789abcdef",
  revoked: "tg_test_revoked_0123456789abcdef",
  future: "tg_test_future_0123456789abcdef0",
  idemBudgeted: "tg_test_idem_budgeted_0123456789",
  idemLimited: "tg_test_idem_limited_01234567890",
};

// One attempt per request: these tests inject one upstream failure and expect the caller to see it.
const config = (upstreamUrl: string) => `
resilience: { retry: { maxAttempts: 1 } }
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
        policy: { defaultMaxOutputTokens: 7, maxOutputTokens: 100 }
        keys:
          - { id: good, secret: ${KEYS.good} }
          - { id: expired, secret: ${KEYS.expired}, expiresAt: "2020-01-01T00:00:00Z" }
          - { id: revoked, secret: ${KEYS.revoked}, revoked: true }
          - { id: future, secret: ${KEYS.future}, expiresAt: "2999-01-01T00:00:00Z" }
      - id: acme-limited
        models: [small]
        defaultModel: small
        limits: { keyRequestsPerMinute: 3 }
        keys:
          - { id: limited, secret: ${KEYS.limited} }
      - id: acme-budgeted
        models: [small]
        defaultModel: small
        budget: { amount: 100 }
        keys:
          - { id: budgeted, secret: ${KEYS.budgeted} }
      - id: acme-models-only
        models: [small]
        defaultModel: small
        routes: [models]
        keys:
          - { id: models-only, secret: ${KEYS.modelsOnly} }
      - id: acme-idem-budgeted
        models: [small]
        defaultModel: small
        budget: { amount: 60 }
        keys:
          - { id: idem-budgeted, secret: ${KEYS.idemBudgeted} }
      - id: acme-idem-limited
        models: [small]
        defaultModel: small
        limits: { keyRequestsPerMinute: 2 }
        keys:
          - { id: idem-limited, secret: ${KEYS.idemLimited} }
`;

describe("account door error contract (all-in-one, in process)", () => {
  let upstream: FakeUpstream;
  let gateway: AllInOne;
  let running: ConfiguredGateway;
  let logs: LogCapture;

  beforeAll(async () => {
    running = await startConfiguredGateway(config, { upstream: { record: true } });
    ({ gateway, upstream, logs } = running);
  });

  afterAll(async () => {
    await running?.stop();
  });

  const chat = (key: string | undefined, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${gateway.url}/v1/chat/completions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...(key ? { authorization: `Bearer ${key}` } : {}),
        ...headers,
      },
      body: typeof body === "string" ? body : JSON.stringify(body),
    });
  const ok = { model: "small", max_tokens: 3, messages: [{ role: "user", content: "hi" }] };

  async function expectError(res: Response, status: number, code: string) {
    const body = (await res.json()) as {
      error: { code: string; type: string; message: string; request_id: string };
    };
    expect({ status: res.status, code: body.error.code }).toEqual({ status, code });
    expect(body.error.message.length).toBeGreaterThan(0);
    expect(body.error.request_id).toBe(res.headers.get("x-request-id"));
    return body.error;
  }

  it.each([
    ["no key", undefined, "missing_api_key"],
    ["an unknown key", "tg_test_unknown_0123456789abcdef", "invalid_api_key"],
    ["an expired key", KEYS.expired, "expired_api_key"],
    ["a revoked key", KEYS.revoked, "revoked_api_key"],
  ])("refuses %s with 401 on both routes, before any model runs", async (_label, key, code) => {
    const before = upstream.requests.length;
    await expectError(await chat(key, ok), 401, code);
    const models = await fetch(
      `${gateway.url}/v1/models`,
      key ? { headers: { authorization: `Bearer ${key}` } } : {},
    );
    await expectError(models, 401, code);
    expect(upstream.requests.length).toBe(before);
  });

  it("accepts a key whose expiry is in the future", async () => {
    expect((await chat(KEYS.future, ok)).status).toBe(200);
  });

  it("refuses a Payment credential, another scheme, or the key in the wrong field with 401", async () => {
    await expectError(
      await chat(undefined, ok, { authorization: "Payment abc.def" }),
      401,
      "wrong_auth_scheme",
    );
    await expectError(
      await chat(undefined, ok, { authorization: `Basic ${KEYS.good}` }),
      401,
      "wrong_auth_scheme",
    );
    await expectError(await chat(undefined, ok, { "x-api-key": KEYS.good }), 401, "wrong_auth_field");
  });

  it("refuses a model outside the connection and a cap above policy with 403, before any model runs", async () => {
    const before = upstream.requests.length;
    await expectError(await chat(KEYS.good, { ...ok, model: "large" }), 403, "model_not_allowed");
    await expectError(await chat(KEYS.good, { ...ok, model: "nonexistent" }), 403, "model_not_allowed");
    await expectError(await chat(KEYS.good, { ...ok, max_tokens: 101 }), 403, "output_cap_above_policy");
    expect(upstream.requests.length).toBe(before);
  });

  it("applies the connection's default cap and forwards the upstream model id", async () => {
    const res = await chat(KEYS.good, { messages: [{ role: "user", content: "hi" }] });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { model: string; usage: { completion_tokens: number } };
    expect(body.model).toBe("small");
    expect(body.usage.completion_tokens).toBe(7);
    const sent = upstream.requests.at(-1)?.body as { model: string; max_tokens: number };
    expect(sent).toMatchObject({ model: "fake-small", max_tokens: 7 });
    expect(res.headers.get("x-tollgate-cost")).toMatch(/^\d+$/);
  });

  it("refuses the request over the key's rate limit with 429, Retry-After and RateLimit headers, before any model runs", async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await chat(KEYS.limited, ok);
      statuses.push(res.status);
      expect(res.headers.get("ratelimit-limit")).toBe("3");
      expect(res.headers.get("ratelimit-remaining")).toBe(String(2 - i));
    }
    expect(statuses).toEqual([200, 200, 200]);
    const before = upstream.requests.length;
    const refused = await chat(KEYS.limited, ok);
    await expectError(refused, 429, "rate_limited");
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(refused.headers.get("ratelimit-limit")).toBe("3");
    expect(refused.headers.get("ratelimit-remaining")).toBe("0");
    expect(upstream.requests.length).toBe(before);
  });

  it("shows each success's cost and the budget left, and refuses a quote that does not fit with 402 before any model runs", async () => {
    const small = { model: "small", max_tokens: 100, messages: [{ role: "user", content: "hi" }] };
    const first = await chat(KEYS.budgeted, small);
    expect(first.status).toBe(200);
    const cost = BigInt(first.headers.get("x-tollgate-cost") ?? "-1");
    expect(cost).toBeGreaterThan(0n);
    expect(first.headers.get("x-tollgate-budget-remaining")).toBe((100n - cost).toString());

    const before = upstream.requests.length;
    const refused = await chat(KEYS.budgeted, { ...small, max_tokens: 1000 });
    const error = await expectError(refused, 402, "budget_exceeded");
    expect(error.type).toBe("insufficient_budget");
    expect(refused.headers.get("x-tollgate-budget-remaining")).toMatch(/^\d+$/);
    expect(Number(refused.headers.get("x-tollgate-budget-reset"))).toBeGreaterThan(0);
    expect(upstream.requests.length).toBe(before);
  });

  it("gives a failed request's budget hold back at once, buffered or streamed", async () => {
    const models = () =>
      fetch(`${gateway.url}/v1/models`, { headers: { authorization: `Bearer ${KEYS.budgeted}` } });
    const left = async () => (await models()).headers.get("x-tollgate-budget-remaining");
    // Whatever earlier tests spent, wait until nothing is held any more.
    let before = await left();
    for (let i = 0; i < 50; i++) {
      await new Promise((r) => setTimeout(r, 50));
      const now = await left();
      if (now === before) break;
      before = now;
    }
    const request = { model: "small", max_tokens: 50, messages: [{ role: "user", content: "hi" }] };
    upstream.failNext(1, { status: 500 });
    expect((await chat(KEYS.budgeted, request)).status).toBe(502);
    expect(await left()).toBe(before);
    upstream.failNext(1, { status: 500 });
    expect((await chat(KEYS.budgeted, { ...request, stream: true })).status).toBe(502);
    expect(await left()).toBe(before);
  });

  it("refuses a route outside the connection's policy with 403", async () => {
    const before = upstream.requests.length;
    await expectError(await chat(KEYS.modelsOnly, ok), 403, "route_not_allowed");
    expect(upstream.requests.length).toBe(before);
    const models = await fetch(`${gateway.url}/v1/models`, {
      headers: { authorization: `Bearer ${KEYS.modelsOnly}` },
    });
    expect(models.status).toBe(200);
  });

  it("lists each model's price per million tokens in /v1/models", async () => {
    const res = await fetch(`${gateway.url}/v1/models`, {
      headers: { authorization: `Bearer ${KEYS.good}` },
    });
    const body = (await res.json()) as {
      data: Array<{ id: string; pricing: { input_per_million: string; output_per_million: string } }>;
    };
    expect(body.data).toEqual([
      expect.objectContaining({
        id: "small",
        pricing: expect.objectContaining({ input_per_million: "100000", output_per_million: "400000" }),
      }),
    ]);
  });

  it("replays an Idempotency-Key byte for byte without running the model again", async () => {
    const before = upstream.requests.length;
    const headers = { "idempotency-key": `idem-${Date.now()}` };
    const first = await chat(KEYS.good, ok, headers);
    const firstBody = Buffer.from(await first.arrayBuffer());
    expect(first.status).toBe(200);
    const second = await chat(KEYS.good, ok, headers);
    expect(second.status).toBe(200);
    expect(second.headers.get("idempotent-replayed")).toBe("true");
    expect(Buffer.from(await second.arrayBuffer()).equals(firstBody)).toBe(true);
    expect(second.headers.get("x-tollgate-cost")).toBe(first.headers.get("x-tollgate-cost"));
    expect(upstream.requests.length).toBe(before + 1);
    await expectError(
      await chat(KEYS.good, { ...ok, max_tokens: 4 }, headers),
      422,
      "idempotency_key_reused",
    );
  });

  it("runs concurrent duplicates of one Idempotency-Key once", async () => {
    upstream.configure({ latencyMs: 200 });
    try {
      const before = upstream.requests.length;
      const headers = { "idempotency-key": `idem-concurrent-${Date.now()}` };
      const responses = await Promise.all(Array.from({ length: 5 }, () => chat(KEYS.good, ok, headers)));
      const bodies = await Promise.all(
        responses.map(async (r) => Buffer.from(await r.arrayBuffer()).toString("base64")),
      );
      expect(responses.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
      expect(new Set(bodies).size).toBe(1);
      expect(upstream.requests.length).toBe(before + 1);
    } finally {
      upstream.configure({ latencyMs: 0 });
    }
  });

  it("replays an Idempotency-Key's answer once its budget or rate limit would refuse the request again: a replay takes nothing", async () => {
    const request = { model: "small", max_tokens: 100, messages: [{ role: "user", content: "hi" }] };
    const headers = { "idempotency-key": `idem-after-${Date.now()}` };
    // The budget: the first answer is stored, then plain requests spend until the quote no longer fits.
    const first = await chat(KEYS.idemBudgeted, request, headers);
    expect(first.status).toBe(200);
    const firstBody = Buffer.from(await first.arrayBuffer());
    let refused: Response | undefined;
    for (let i = 0; i < 20 && !refused; i++) {
      const res = await chat(KEYS.idemBudgeted, request);
      if (res.status === 200) await res.arrayBuffer();
      else refused = res;
    }
    await expectError(refused!, 402, "budget_exceeded");
    const before = upstream.requests.length;
    const replayed = await chat(KEYS.idemBudgeted, request, headers);
    expect(replayed.status).toBe(200);
    expect(replayed.headers.get("idempotent-replayed")).toBe("true");
    expect(Buffer.from(await replayed.arrayBuffer()).equals(firstBody)).toBe(true);
    expect(replayed.headers.get("x-tollgate-cost")).toBe(first.headers.get("x-tollgate-cost"));
    expect(upstream.requests.length).toBe(before);
    // The same key with another body is still its 422, not the budget's 402.
    await expectError(
      await chat(KEYS.idemBudgeted, { ...request, max_tokens: 99 }, headers),
      422,
      "idempotency_key_reused",
    );

    // The rate limit (2 a minute): one answer stored, one plain request, then the limit is reached.
    const limitedHeaders = { "idempotency-key": `idem-limited-${Date.now()}` };
    const stored = await chat(KEYS.idemLimited, request, limitedHeaders);
    expect(stored.status).toBe(200);
    const storedBody = Buffer.from(await stored.arrayBuffer());
    expect((await chat(KEYS.idemLimited, request)).status).toBe(200);
    await expectError(await chat(KEYS.idemLimited, request), 429, "rate_limited");
    const ran = upstream.requests.length;
    for (let i = 0; i < 3; i++) {
      const again = await chat(KEYS.idemLimited, request, limitedHeaders);
      expect(again.status).toBe(200);
      expect(again.headers.get("idempotent-replayed")).toBe("true");
      expect(Buffer.from(await again.arrayBuffer()).equals(storedBody)).toBe(true);
    }
    expect(upstream.requests.length).toBe(ran);
  });

  it("answers bad input with the right 4xx, checking the key first", async () => {
    await expectError(await chat(KEYS.good, "{not json"), 400, "invalid_json");
    await expectError(await chat(KEYS.good, { model: "small", messages: [] }), 400, "invalid_request");
    await expectError(await chat(KEYS.good, { ...ok, max_tokens: -1 }), 400, "invalid_request");
    await expectError(
      await chat(KEYS.good, { ...ok, messages: [{ role: "wizard", content: "x" }] }),
      400,
      "invalid_request",
    );
    // A bad key with a bad body is still a 401.
    await expectError(await chat("tg_wrong_000000000000000000000", { messages: [] }), 401, "invalid_api_key");
    await expectError(
      await chat(KEYS.good, "x=1", { "content-type": "text/plain" }),
      415,
      "unsupported_media_type",
    );
    const huge = JSON.stringify({
      ...ok,
      messages: [{ role: "user", content: "x".repeat(5 * 1024 * 1024) }],
    });
    await expectError(await chat(KEYS.good, huge), 413, "payload_too_large");
    const notFound = await fetch(`${gateway.url}/v1/nope`, {
      headers: { authorization: `Bearer ${KEYS.good}` },
    });
    await expectError(notFound, 404, "not_found");
  });

  it("maps an upstream failure to a retry-safe 502 without leaking its cause", async () => {
    upstream.failNext(1, { status: 500, body: '{"error":{"message":"secret stack trace"}}' });
    const error = await expectError(await chat(KEYS.good, ok), 502, "upstream_error");
    expect(error.type).toBe("server_error");
    expect(error.message).not.toContain("secret stack trace");
    upstream.failNext(1, { status: 400, body: '{"error":{"message":"context length exceeded"}}' });
    const rejected = await expectError(await chat(KEYS.good, ok), 400, "upstream_rejected");
    expect(rejected.message).toContain("context length exceeded");
  });

  it("streams to an HTTP/1.0 caller: every event to data: [DONE], ended by closing the connection, the cost in the last event", async () => {
    const body = JSON.stringify({ ...ok, stream: true, stream_options: { include_usage: true } });
    const { host, port } = new URL(gateway.url);
    // The stream's end is the connection's: HTTP/1.0 has no chunked framing to end it by.
    const raw = await rawExchange(
      Number(port),
      `POST /v1/chat/completions HTTP/1.0\r\nHost: ${host}\r\nAuthorization: Bearer ${KEYS.good}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    const [head = "", events = ""] = raw.split("\r\n\r\n");
    expect(head).toMatch(/^HTTP\/1\.[01] 200/);
    expect(head.toLowerCase()).not.toContain("trailer");
    expect(events.trimEnd().endsWith("data: [DONE]")).toBe(true);
    expect(events).toMatch(/"x_tollgate":\{"cost":"\d+"/);
  });

  it("never logs a key", async () => {
    await new Promise((r) => setTimeout(r, 200));
    const text = logs.text();
    expect(text).toContain("request served");
    for (const key of Object.values(KEYS)) expect(text).not.toContain(key);
  });
});
