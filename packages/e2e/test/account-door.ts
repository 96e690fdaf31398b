import { randomBytes } from "node:crypto";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/** A running gateway the scenarios talk to. */
export interface Target {
  url: string;
  key: string;
  /** Everything the gateway's processes logged so far (not the demo banner). */
  logs(): string;
  stop(): Promise<void>;
}

/** Prompt text that must never show up in a log line. */
export const SECRET_PROMPT = `Tell me about the saffron-${randomBytes(6).toString("hex")} recipe`;

/**
 * The account door's spine, driven by the official openai SDK exactly as a user would, pointed
 * at {url}/v1 with the printed key (docs/contract.md, "The two doors").
 */
export function describeAccountDoor(
  name: string,
  setup: () => Promise<Target>,
  more?: (target: () => Target) => void,
) {
  describe(name, () => {
    let target: Target;
    let client: OpenAI;

    beforeAll(async () => {
      target = await setup();
      client = new OpenAI({ baseURL: `${target.url}/v1`, apiKey: target.key, maxRetries: 0 });
    });

    afterAll(async () => {
      await target?.stop();
    });

    it("lists only the key's models", async () => {
      const ids: string[] = [];
      for await (const m of client.models.list()) ids.push(m.id);
      expect(ids).toEqual(["tollgate-mini", "tollgate-pro", "tollgate-reasoner", "tollgate-embed-mini"]);
    });

    it("completes a buffered chat with usage and the public model id", async () => {
      const res = await client.chat.completions.create({
        model: "tollgate-mini",
        max_tokens: 8,
        messages: [{ role: "user", content: SECRET_PROMPT }],
      });
      expect(res.model).toBe("tollgate-mini");
      expect(res.choices[0]?.message.content?.trim().split(" ")).toHaveLength(8);
      expect(res.choices[0]?.finish_reason).toBe("length");
      expect(res.usage?.completion_tokens).toBe(8);
      expect(res.usage?.prompt_tokens).toBeGreaterThan(0);
    });

    it("uses the connection's default model when model is omitted", async () => {
      const res = await fetch(`${target.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${target.key}`, "content-type": "application/json" },
        body: JSON.stringify({ max_tokens: 4, messages: [{ role: "user", content: SECRET_PROMPT }] }),
      });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { model: string }).model).toBe("tollgate-mini");
    });

    it("streams a chat as SSE chunks whose text equals the buffered answer", async () => {
      const params = {
        model: "tollgate-pro",
        max_tokens: 6,
        messages: [{ role: "user" as const, content: SECRET_PROMPT }],
      };
      const buffered = await client.chat.completions.create(params);
      const stream = await client.chat.completions.create({ ...params, stream: true });
      let text = "";
      let chunks = 0;
      let sawUsage = false;
      for await (const chunk of stream) {
        chunks++;
        expect(chunk.model).toBe("tollgate-pro");
        text += chunk.choices[0]?.delta?.content ?? "";
        if (chunk.usage) sawUsage = true;
      }
      expect(chunks).toBeGreaterThanOrEqual(6);
      expect(text).toBe(buffered.choices[0]?.message.content);
      // The caller did not ask for usage, so none is sent (it is still recorded).
      expect(sawUsage).toBe(false);
    });

    it("sends the usage chunk last when the caller asks for it", async () => {
      const stream = await client.chat.completions.create({
        model: "tollgate-mini",
        max_tokens: 5,
        stream: true,
        stream_options: { include_usage: true },
        messages: [{ role: "user", content: SECRET_PROMPT }],
      });
      const chunks = [];
      for await (const chunk of stream) chunks.push(chunk);
      const last = chunks.at(-1);
      expect(last?.choices).toEqual([]);
      expect(last?.usage?.completion_tokens).toBe(5);
    });

    it("refuses a bad key with 401 and an OpenAI-style body", async () => {
      const bad = new OpenAI({
        baseURL: `${target.url}/v1`,
        apiKey: "tg_not_a_real_key_000000000000",
        maxRetries: 0,
      });
      const err = await bad.models.list().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
      expect((err as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe("invalid_api_key");
    });

    it("refuses a Payment credential on the account door with 401", async () => {
      const res = await fetch(`${target.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: "Payment eyJjaGFsbGVuZ2UiOnt9fQ", "content-type": "application/json" },
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: 4,
          messages: [{ role: "user", content: "hi" }],
        }),
      });
      expect(res.status).toBe(401);
      const body = (await res.json()) as { error: { code: string; request_id: string } };
      expect(body.error.code).toBe("wrong_auth_scheme");
      expect(body.error.request_id).toBe(res.headers.get("x-request-id"));
    });

    it("echoes a caller's X-Request-Id", async () => {
      const res = await fetch(`${target.url}/v1/models`, {
        headers: { authorization: `Bearer ${target.key}`, "x-request-id": "trace-abc-123" },
      });
      expect(res.headers.get("x-request-id")).toBe("trace-abc-123");
    });

    it("never adopts a key pasted into X-Request-Id, so no log line carries it", async () => {
      const res = await fetch(`${target.url}/v1/models`, {
        headers: { authorization: `Bearer ${target.key}`, "x-request-id": target.key },
      });
      expect(res.status).toBe(200);
      expect(res.headers.get("x-request-id")).toMatch(/^req_/);
    });

    it("never logs the key or the prompt text", async () => {
      // Give asynchronous log writers a moment to flush.
      await new Promise((r) => setTimeout(r, 300));
      const logs = target.logs();
      expect(logs).toContain("request served");
      expect(logs).not.toContain(target.key);
      expect(logs).not.toContain(SECRET_PROMPT);
      expect(logs).not.toContain("saffron");
    });

    more?.(() => target);
  });
}
