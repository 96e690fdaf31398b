import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createAnthropicProvider } from "../anthropic/provider.js";
import { createOpenAICompatibleProvider } from "../openai-compatible/provider.js";
import { drain, failure } from "./testing.js";

/**
 * The gateway's upstream key never reaches a caller in an upstream_rejected message: neither in
 * an Anthropic stream's error event (answered 200, then `event: error`), nor when the upstream's
 * JSON escapes a character of the key ("/" as "\/").
 */
const KEY = "sk-ant-api03/abcdefghijklmnop";
let server: Server;
let url = "";
let answer: (res: import("node:http").ServerResponse) => void = () => {};

beforeAll(async () => {
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => answer(res));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

const TIMEOUTS = { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000, totalMs: 5_000 };
const body = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 5 };

describe("upstream credentials in a rejection", () => {
  it("are redacted from an Anthropic stream's invalid_request_error event", async () => {
    answer = (res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const error = { type: "invalid_request_error", message: `bad header x-api-key: ${KEY}` };
      res.end(`event: error\ndata: ${JSON.stringify({ type: "error", error })}\n\n`);
    };
    const p = createAnthropicProvider({ id: "a", baseUrl: url, timeouts: TIMEOUTS, apiKey: KEY });
    const err = await failure(
      drain(p.stream({ operation: "chat", body: { ...body, stream: true } }, new AbortController().signal)),
    );
    await p.close();
    expect(err.code).toBe("upstream_rejected");
    expect(err.message).not.toContain(KEY);
  });

  it("are redacted when the upstream's JSON escapes a character of the key", async () => {
    answer = (res) => {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(`{"error":{"message":"sent with Bearer ${KEY.replace("/", "\\/")}"}}`);
    };
    const p = createOpenAICompatibleProvider({
      id: "o",
      baseUrl: `${url}/v1`,
      timeouts: TIMEOUTS,
      apiKey: KEY,
    });
    const err = await failure(p.complete({ operation: "chat", body }, new AbortController().signal));
    await p.close();
    expect(err.code).toBe("upstream_rejected");
    expect(err.message).not.toContain(KEY);
  });
});
