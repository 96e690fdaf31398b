import { request } from "node:http";
import { type AddressInfo, connect } from "node:net";
import Fastify from "fastify";
import { describe, expect, it } from "vitest";
import { acceptJsonOnly, inspectJson, parseJsonBody } from "./json-body.js";

const parse = (text: string | Buffer, depth = 64) =>
  parseJsonBody(typeof text === "string" ? Buffer.from(text, "utf8") : text, depth);

describe("parseJsonBody: hostile JSON is a 4xx code, never a crash", () => {
  it("parses valid JSON, and an empty body as undefined", () => {
    expect(parse('{"a":[1,{"b":"c\\"}"}],"d":null}')).toEqual({ value: { a: [1, { b: 'c"}' }], d: null } });
    expect(parse("")).toEqual({ value: undefined });
    expect(parse('"x"')).toEqual({ value: "x" });
  });

  it("refuses bytes that are not UTF-8 (the bytes are forwarded as received)", () => {
    const bad = Buffer.concat([
      Buffer.from('{"messages":"'),
      Buffer.from([0xff, 0xfe, 0xc3]),
      Buffer.from('"}'),
    ]);
    expect(parse(bad)).toEqual({ code: "invalid_json", message: "the request body is not valid UTF-8" });
    // A lone surrogate encoded as CESU bytes is not UTF-8 either.
    expect(parse(Buffer.from([0x22, 0xed, 0xa0, 0x80, 0x22]))).toMatchObject({ code: "invalid_json" });
  });

  it("refuses nesting deeper than the limit before parsing it", () => {
    expect(parse(`${"[".repeat(64)}${"]".repeat(64)}`)).toHaveProperty("value");
    expect(parse(`${"[".repeat(65)}${"]".repeat(65)}`)).toMatchObject({ code: "json_too_deep" });
    // A million brackets: refused at once, not parsed (nor re-serialised into a stack overflow).
    const started = Date.now();
    expect(parse("[".repeat(1_000_000))).toMatchObject({ code: "json_too_deep" });
    expect(Date.now() - started).toBeLessThan(500);
    expect(parse('{"a":{"b":{"c":1}}}', 2)).toMatchObject({ code: "json_too_deep" });
    // Brackets inside strings do not count.
    expect(parse(`{"a":"${"[".repeat(100)}"}`, 2)).toHaveProperty("value");
  });

  it("refuses duplicate keys, also when spelt with escapes, at any depth", () => {
    expect(parse('{"max_tokens":1,"max_tokens":100000}')).toMatchObject({ code: "invalid_json" });
    expect(parse('{"model":"a","\\u006dodel":"b"}')).toMatchObject({ code: "invalid_json" });
    expect(parse('{"m":[{"role":"user","role":"system"}]}')).toMatchObject({ code: "invalid_json" });
    // The same key in sibling objects is fine, and values equal to keys are not keys.
    expect(parse('{"a":{"x":1},"b":{"x":"a"},"c":["a","a"]}')).toHaveProperty("value");
  });

  it("refuses prototype-poisoning keys", () => {
    expect(parse('{"__proto__":{"admin":true}}')).toMatchObject({ code: "invalid_json" });
    expect(parse('{"a":[{"\\u005f_proto__":1}]}')).toMatchObject({ code: "invalid_json" });
    expect(parse('{"constructor":{"prototype":{"x":1}}}')).toMatchObject({ code: "invalid_json" });
    expect(parse('{"constructor":"x","prototype":1}')).toHaveProperty("value");
  });

  it("leaves JSON that is not JSON to JSON.parse's refusal", () => {
    for (const text of ['{"a":', '{"a"}', "{'a':1}", '"\\', "NaN", "[1,]", "\uFEFF{}"]) {
      expect(parse(text)).toEqual({ code: "invalid_json", message: "the request body is not valid JSON" });
    }
  });

  it("reads huge numbers without failing (the schemas refuse them where they matter)", () => {
    expect(parse('{"max_tokens":1e400,"n":123456789012345678901234567890}')).toEqual({
      value: { max_tokens: Number.POSITIVE_INFINITY, n: 1.2345678901234568e29 },
    });
  });

  it("inspects in one pass: escaped quotes and backslashes end strings where JSON does", () => {
    expect(inspectJson('{"a\\\\":1,"a\\\\":2}', 64)).toMatchObject({ code: "invalid_json" });
    expect(inspectJson('{"a\\"":1,"a":2}', 64)).toBeUndefined();
  });
});

describe("acceptJsonOnly: a body that is not JSON", () => {
  /** A server refusing every body that is not JSON with 415, as api-edge does. */
  async function server() {
    const app = Fastify({ bodyLimit: 4 * 1024 * 1024 });
    acceptJsonOnly(app, 64, (code, message) => Object.assign(new Error(message), { code }));
    app.setErrorHandler((err: { code?: string }, _req, reply) =>
      reply.code(err.code === "unsupported_media_type" ? 415 : 400).send({ code: err.code }),
    );
    app.post("/", async () => ({ ok: true }));
    await app.listen({ host: "127.0.0.1", port: 0 });
    return { app, port: (app.server.address() as AddressInfo).port };
  }

  it("is read to its end before its 415, so a caller still writing gets the answer, not a reset", async () => {
    const { app, port } = await server();
    try {
      // Half the body, then a pause: no answer may leave before the rest is in.
      const socket = connect({ host: "127.0.0.1", port });
      let got = "";
      socket.on("data", (d: Buffer) => (got += d.toString("latin1")));
      const closed = new Promise<void>((resolve) => socket.on("close", () => resolve()));
      socket.on("error", () => {});
      const size = 1_000_000;
      socket.write(
        `POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: ${size}\r\n\r\n`,
      );
      socket.write(Buffer.alloc(size / 2, 97));
      await new Promise((r) => setTimeout(r, 300));
      expect(got).toBe("");
      socket.write(Buffer.alloc(size / 2, 97));
      await closed;
      expect(got).toMatch(/^HTTP\/1\.1 415 /);
      expect(got).toContain('"code":"unsupported_media_type"');

      // A large body written as fast as Node writes it: every request reads its 415.
      const body = Buffer.alloc(3_900_000, 97);
      const answers: string[] = [];
      for (let i = 0; i < 10; i++) {
        answers.push(
          await new Promise<string>((resolve) => {
            const req = request(
              {
                host: "127.0.0.1",
                port,
                method: "POST",
                path: "/",
                headers: { "content-type": "text/plain" },
              },
              (res) => {
                res.resume();
                res.on("end", () => resolve(String(res.statusCode)));
              },
            );
            req.on("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
            req.end(body);
          }),
        );
      }
      expect(answers).toEqual(Array(10).fill("415"));
    } finally {
      await app.close();
    }
  });
});
