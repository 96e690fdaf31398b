import { randomInt } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { Agent, request as httpRequest } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { DEMO_CONFIG, REPO_ROOT } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type SpawnedGateway, spawnAllInOne } from "./gateways.js";

// Hostile input on the public port (docs/account-door.md, "Limits"): a seeded, bounded fuzz run against the
// all-in-one process (the same api-edge code as the stack), spawned as `npm start` runs it.
// FUZZ_SEED replays a run; FUZZ_SECONDS and FUZZ_MAX_CASES bound it.
const SEED = Number(process.env.FUZZ_SEED ?? randomInt(2 ** 31));
const SECONDS = Number(process.env.FUZZ_SECONDS ?? 20);
const MAX_CASES = Number(process.env.FUZZ_MAX_CASES ?? 20_000);
const SUMMARY_FILE = process.env.FUZZ_SUMMARY_FILE ?? join(REPO_ROOT, ".tollgate/fuzz/summary.txt");
// Short slowloris timeouts for the test; production defaults are 10 s and 60 s.
const HEADERS_TIMEOUT_MS = 1_500;
const REQUEST_TIMEOUT_MS = 3_000;
const BODY_LIMIT = 4 * 1024 * 1024;

/** Every code a refusal may carry on the public port, with its status (docs/account-door.md, "Errors" and "Limits"). */
const STATUS_BY_CODE: Record<string, number> = {
  invalid_json: 400,
  json_too_deep: 400,
  invalid_request: 400,
  model_cannot_reason: 400,
  model_kind_mismatch: 400,
  idempotency_key_invalid: 400,
  idempotency_unsupported_for_streams: 400,
  upstream_rejected: 400,
  missing_api_key: 401,
  invalid_api_key: 401,
  wrong_auth_scheme: 401,
  wrong_auth_field: 401,
  model_not_allowed: 403,
  route_not_allowed: 403,
  output_cap_above_policy: 403,
  not_found: 404,
  method_not_allowed: 405,
  request_timeout: 408,
  payload_too_large: 413,
  unsupported_media_type: 415,
  idempotency_key_reused: 422,
  headers_too_large: 431,
  // The paid door.
  payment_required: 402,
  mpp_malformed_credential: 402,
  mpp_invalid_challenge: 402,
  mpp_body_digest_mismatch: 402,
  mpp_payment_verification_failed: 402,
  mpp_method_unsupported: 400,
  mpp_invalid_request: 400,
  mpp_request_quote_invalid: 400,
  mpp_request_exceeds_voucher_bucket: 400,
  mpp_streaming_unavailable: 400,
};

/** mulberry32: small, fast and good enough to pick cases; one seed replays one run. */
function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n: number) => Math.floor(next() * n);
  return {
    next,
    int,
    chance: (p: number) => next() < p,
    pick: <T>(xs: readonly T[]): T => xs[int(xs.length)]!,
    bytes: (n: number) => Buffer.from(Array.from({ length: n }, () => int(256))),
    base64url: (n: number) => {
      const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
      let s = "";
      for (let i = 0; i < n; i++) s += abc[int(64)];
      return s;
    },
  };
}
type Rng = ReturnType<typeof prng>;

/** One case: what was sent and how to tell what it was. */
interface Case {
  kind: string;
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: Buffer;
  /** Sent over a raw socket exactly as these bytes. */
  raw?: Buffer;
}

interface Answer {
  status: number;
  body: string;
  contentType: string;
}

const ROUTES = [
  { method: "POST", path: "/v1/chat/completions" },
  { method: "POST", path: "/v1/completions" },
  { method: "POST", path: "/v1/responses" },
  { method: "POST", path: "/v1/think" },
  { method: "POST", path: "/v1/embeddings" },
  { method: "GET", path: "/v1/models" },
  { method: "POST", path: "/v1/mpp/chat/completions" },
] as const;

function validBody(r: Rng, path: string): Record<string, unknown> | undefined {
  const messages = [{ role: "user", content: r.pick(["hi", "Say hello", "ünïcødé ✓ 🚀", ""]) }];
  switch (path) {
    case "/v1/chat/completions":
      return {
        model: "tollgate-mini",
        max_tokens: 1 + r.int(8),
        messages,
        ...(r.chance(0.2) ? { stream: true } : {}),
      };
    case "/v1/completions":
      return { model: "tollgate-mini", max_tokens: 1 + r.int(8), prompt: r.chance(0.5) ? "hi" : ["a", "b"] };
    case "/v1/responses":
      return {
        model: "tollgate-mini",
        max_output_tokens: 1 + r.int(8),
        input: r.chance(0.5) ? "hi" : messages,
      };
    case "/v1/think":
      return { model: "tollgate-reasoner", max_output_tokens: 16, prompt: "why?" };
    case "/v1/embeddings":
      return {
        model: "tollgate-embed-mini",
        input: r.chance(0.5) ? "hi" : ["a", [1, 2]].slice(0, 1 + r.int(2)),
      };
    case "/v1/mpp/chat/completions":
      return { plan: "Starter", model_optimization: true, max_tokens: 8, messages };
    default:
      return undefined;
  }
}

function randomString(r: Rng): string {
  switch (r.int(6)) {
    case 0:
      return "";
    case 1:
      return "x".repeat(r.pick([1, 256, 257, 10_000, 200_000]));
    case 2:
      return String.fromCharCode(...Array.from({ length: 1 + r.int(40) }, () => r.int(0x10000)));
    case 3:
      return '\u0000\u001f\u007f\u2028\u2029\uFEFF\\"';
    case 4:
      return r.pick([
        "tollgate-mini",
        "tollgate-pro",
        "tollgate-reasoner",
        "tollgate-embed-mini",
        "user",
        "system",
        "wizard",
        "Starter",
      ]);
    default:
      return r.base64url(r.int(64));
  }
}

function randomValue(r: Rng, depth = 0): unknown {
  switch (r.int(depth > 3 ? 6 : 9)) {
    case 0:
      return null;
    case 1:
      return r.chance(0.5);
    case 2:
      return r.pick([0, -1, 1, 2, 4096, 4097, 1_000_001, 2 ** 53 + 1, 1e308, -1e308, 5e-324, 0.5, -0.0]);
    case 3:
    case 4:
      return randomString(r);
    case 5:
      return r.int(1_000_000) - 500;
    case 6:
      return Array.from({ length: r.int(5) }, () => randomValue(r, depth + 1));
    case 7:
      return Object.fromEntries(
        Array.from({ length: r.int(5) }, () => [randomString(r).slice(0, 20), randomValue(r, depth + 1)]),
      );
    default:
      return { role: r.pick(["user", "assistant", "tool"]), content: randomValue(r, depth + 1) };
  }
}

/** Replaces, removes or adds one field somewhere in a body. */
function mutateValue(r: Rng, v: unknown, depth = 0): unknown {
  if (Array.isArray(v) && v.length > 0 && r.chance(0.7)) {
    const copy = [...v];
    const i = r.int(copy.length);
    copy[i] = mutateValue(r, copy[i], depth + 1);
    // Over-long lists, of small items only: a list of lists grown at every level would not fit
    // in a string, let alone a request.
    if (r.chance(0.1) && JSON.stringify(copy[0] ?? null).length < 1_000)
      return Array.from({ length: r.pick([0, 2049, 3000]) }, () => copy[0]);
    return copy;
  }
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const obj = { ...(v as Record<string, unknown>) };
    const keys = Object.keys(obj);
    const op = r.int(4);
    if (op === 0 && keys.length > 0) delete obj[r.pick(keys)];
    else if (op === 1 || keys.length === 0)
      obj[r.pick(["n", "stream", "tools", "user", "stop", randomString(r).slice(0, 12)])] = randomValue(r);
    else {
      const k = r.pick(keys);
      obj[k] = r.chance(0.5) ? mutateValue(r, obj[k], depth + 1) : randomValue(r);
    }
    return obj;
  }
  return randomValue(r);
}

/** Byte-level damage to a serialised body. */
function mutateBytes(r: Rng, b: Buffer): Buffer {
  switch (r.int(8)) {
    case 0:
      return b.subarray(0, r.int(b.length + 1));
    case 1: {
      const c = Buffer.from(b);
      for (let i = 0; i < 1 + r.int(4); i++) if (c.length) c[r.int(c.length)] = r.int(256);
      return c;
    }
    case 2: {
      const at = r.int(b.length + 1);
      return Buffer.concat([
        b.subarray(0, at),
        Buffer.from(
          r.pick([[0xff], [0xc3], [0xed, 0xa0, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xc0, 0xaf]]),
        ),
        b.subarray(at),
      ]);
    }
    case 3:
      return Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), b]);
    case 4: // a duplicate key the schema would not see
      return Buffer.from(
        b
          .toString("utf8")
          .replace(
            /^\{/,
            r.pick([
              '{"max_tokens":100000,',
              '{"model":"tollgate-pro",',
              '{"stream":true,',
              '{"messages":[],',
            ]),
          ),
      );
    case 5:
      return Buffer.from(
        b
          .toString("utf8")
          .replace(
            /^\{/,
            r.pick([
              '{"__proto__":{"admin":true},',
              '{"constructor":{"prototype":{"x":1}},',
              '{"a":{"\\u005f_proto__":1},',
            ]),
          ),
      );
    case 6:
      return Buffer.concat([b, r.bytes(r.int(16))]);
    default:
      return r.bytes(r.int(200));
  }
}

function deepJson(r: Rng): Buffer {
  const depth = r.pick([63, 64, 65, 100, 1_000, 100_000]);
  const open = r.chance(0.5) ? "[" : '{"a":';
  const close = open === "[" ? "]" : "}";
  return Buffer.from(`{"model":"tollgate-mini","messages":${open.repeat(depth)}1${close.repeat(depth)}}`);
}

function authorization(r: Rng, key: string): Record<string, string> {
  switch (r.int(12)) {
    case 0:
      return {};
    case 1:
      return { authorization: `Bearer ${r.base64url(r.pick([1, 32, 256, 257, 4096, 15_000, 20_000]))}` };
    case 2:
      return { authorization: `Bearer ${key.slice(0, r.int(key.length))}` };
    case 3:
      return { authorization: `Payment ${r.base64url(r.pick([0, 10, 100, 8_192, 9_000, 17_000]))}` };
    case 4:
      return {
        authorization: `Payment ${Buffer.from(JSON.stringify(randomValue(r))).toString("base64url")}`,
      };
    case 5:
      return {
        authorization: `${r.pick(["Basic", "Digest", "bearer", "BEARER", "Token", "Payment,Bearer", ""])} ${key}`,
      };
    case 6:
      return { authorization: `Bearer  ${key} extra` };
    case 7:
      return { "x-api-key": key };
    default:
      return { authorization: `Bearer ${key}` };
  }
}

function contentType(r: Rng): Record<string, string> {
  if (r.chance(0.8)) return { "content-type": "application/json" };
  const ct = r.pick([
    "",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=utf-8",
    "application/json; charset=latin1",
    "APPLICATION/JSON",
    "application/json;;;",
    "application/jsonx",
    "application/problem+json",
    "*/*",
    ";",
  ]);
  return ct === "" ? {} : { "content-type": ct };
}

function extraHeaders(r: Rng): Record<string, string> {
  const h: Record<string, string> = {};
  if (r.chance(0.1)) h["x-request-id"] = r.pick(["ok-id", "x".repeat(200), "bad id!", ""]);
  if (r.chance(0.1)) h["idempotency-key"] = r.pick([`fuzz-${r.int(1e9)}`, "", "é", "x".repeat(300)]);
  if (r.chance(0.05)) h["x-big"] = "y".repeat(r.pick([1_000, 17_000]));
  if (r.chance(0.05)) h.accept = "text/event-stream";
  return h;
}

const RAW_REQUESTS: ReadonlyArray<(r: Rng, key: string) => string | Buffer> = [
  () => "GARBAGE\r\n\r\n",
  () => "GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
  (_r, key) => `GET /v1/models HTTP/1.1\r\nAuthorization: Bearer ${key}\r\nConnection: close\r\n\r\n`,
  () => "GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\nConnection: close\r\n\r\n",
  () => "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-\u0000: y\r\nConnection: close\r\n\r\n",
  () => "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\nConnection: close\r\n\r\n",
  () =>
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
  (_r, key) =>
    `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`,
  (_r, key) =>
    `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n`,
  (r) =>
    `GET /v1/models?${"a".repeat(r.pick([100, 20_000]))} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
  (r) =>
    `GET /v1/models HTTP/1.1\r\nHost: x\r\n${Array.from({ length: r.pick([100, 3000]) }, (_, i) => `X-H${i}: v`).join("\r\n")}\r\nConnection: close\r\n\r\n`,
  () => "GET /v1/%zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  () => "GET /v1/models/../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  () => "GET //v1//models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  () => "OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  () => "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
  () => "GET /v1/models HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
  () => "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
  (r) =>
    Buffer.concat([
      Buffer.from("GET /v1/models HTTP/1.1\r\nHost: "),
      r.bytes(20),
      Buffer.from("\r\nConnection: close\r\n\r\n"),
    ]),
  (r) => r.bytes(1 + r.int(300)),
];

function makeCase(r: Rng, key: string): Case {
  if (r.chance(0.08)) {
    const raw = r.pick(RAW_REQUESTS)(r, key);
    const bytes = Buffer.isBuffer(raw) ? raw : Buffer.from(raw, "latin1");
    return {
      kind: "raw",
      method: "RAW",
      path: JSON.stringify(bytes.subarray(0, 60).toString("latin1").replaceAll(key, "<key>")),
      headers: {},
      raw: bytes,
    };
  }
  const route = r.pick(ROUTES);
  let method: string = route.method;
  if (r.chance(0.05)) method = r.pick(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "POST"]);
  let path: string = route.path;
  if (r.chance(0.05))
    path = r.pick([
      `${path}/`,
      `${path}?x=${r.base64url(20)}`,
      `${path}%00`,
      path.toUpperCase(),
      `/v1/${r.base64url(8)}`,
      `${path}#x`,
    ]);
  const headers = { ...authorization(r, key), ...extraHeaders(r) };
  const valid = validBody(r, route.path);
  let body: Buffer | undefined;
  let kind = "valid";
  const roll = r.next();
  if (method === "GET" || method === "HEAD") body = undefined;
  else if (roll < 0.02) {
    kind = "huge";
    body = Buffer.from(
      JSON.stringify({
        ...valid,
        messages: [{ role: "user", content: "x".repeat(BODY_LIMIT + r.int(1000)) }],
      }),
    );
  } else if (roll < 0.08) {
    kind = "deep";
    body = deepJson(r);
  } else if (roll < 0.1) {
    kind = "empty";
    body = Buffer.alloc(0);
  } else if (roll < 0.4) {
    kind = "mutated";
    body = Buffer.from(JSON.stringify(mutateValue(r, valid ?? {})));
  } else if (roll < 0.6) {
    kind = "bytes";
    body = mutateBytes(r, Buffer.from(JSON.stringify(valid ?? {})));
  } else if (roll < 0.65) {
    kind = "non-object";
    body = Buffer.from(r.pick(["[]", "1", '"x"', "null", "true", "1e999", "[{}]"]));
  } else {
    body = Buffer.from(JSON.stringify(valid ?? {}));
  }
  return {
    kind,
    method,
    path,
    headers: { ...(body ? contentType(r) : {}), ...headers },
    ...(body ? { body } : {}),
  };
}

const agent = new Agent({ keepAlive: true, maxSockets: 1 });

/**
 * Sends a case over the kept-alive connection. A reset met on a reused connection before any
 * answer is the race Node's http docs describe (`request.reusedSocket`): the server closed the
 * idle connection as the request went out, so it never saw it. It shows as ECONNRESET, or as
 * EPIPE when the write comes after the close has arrived. That one case is sent again, once,
 * on a new connection; any other failure is the gateway's.
 */
async function sendHttp(port: number, c: Case, timeoutMs: number): Promise<Answer> {
  try {
    return await sendHttpOnce(port, c, timeoutMs);
  } catch (err) {
    if (!(err instanceof ReusedSocketReset)) throw err;
    return sendHttpOnce(port, c, timeoutMs);
  }
}

class ReusedSocketReset extends Error {}

function sendHttpOnce(port: number, c: Case, timeoutMs: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: "127.0.0.1",
        port,
        method: c.method,
        path: c.path,
        headers: { ...c.headers, ...(c.body ? { "content-length": String(c.body.length) } : {}) },
        agent,
        timeout: timeoutMs,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (d: Buffer) => chunks.push(d));
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            body: Buffer.concat(chunks).toString("utf8"),
            contentType: String(res.headers["content-type"] ?? ""),
          }),
        );
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error("no answer in time")));
    req.on("error", (err: NodeJS.ErrnoException) =>
      reject(
        req.reusedSocket && (err.code === "ECONNRESET" || err.code === "EPIPE")
          ? new ReusedSocketReset(err.message)
          : new Error(`${err.message} (on a ${req.reusedSocket ? "reused" : "new"} connection)`),
      ),
    );
    req.end(c.body);
  });
}

/**
 * A large body or a HEAD request goes over its own connection. A large body is written a chunk
 * at a time and no more once the answer is in: the server reads an oversized body before its
 * 413 only up to four times the limit and answers a larger one on its Content-Length, after
 * which a reset could swallow the answer of a caller that wrote on. A HEAD answer has no
 * body, whatever its Content-Length says (and a parser refusal, made before the method is
 * known, carries one).
 */
function asRaw(c: Case): { head: Buffer; body: Buffer } {
  const head = [`${c.method} ${c.path} HTTP/1.1`, "Host: 127.0.0.1"];
  for (const [k, v] of Object.entries(c.headers)) head.push(`${k}: ${v}`);
  if (c.body) head.push(`Content-Length: ${c.body.length}`);
  // As curl does for a large body: the server may refuse on the headers alone.
  if (c.body && c.body.length > 1024 * 1024) head.push("Expect: 100-continue");
  return { head: Buffer.from(`${head.join("\r\n")}\r\n\r\n`, "latin1"), body: c.body ?? Buffer.alloc(0) };
}

/** The first response in `data`, once it is complete (by Content-Length), else undefined. */
function completeAnswer(data: Buffer, closed: boolean, isHead: boolean): Answer | undefined {
  const text = data.toString("latin1");
  const interim = /^HTTP\/1\.1 100 [^\r]*\r\n\r\n/.exec(text)?.[0].length ?? 0;
  if (interim > 0) return completeAnswer(data.subarray(interim), closed, isHead);
  const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
  const end = text.indexOf("\r\n\r\n");
  if (!m || end === -1) return undefined;
  const head = text.slice(0, end);
  const declared = /\r\ncontent-length: *(\d+)/i.exec(head)?.[1];
  const length = isHead && !closed ? 0 : declared !== undefined ? Number(declared) : undefined;
  const bodyBytes = data.subarray(end + 4);
  if (length !== undefined ? bodyBytes.length < length : !closed) return undefined;
  return {
    status: Number(m[1]),
    body: bodyBytes.subarray(0, length).toString("utf8"),
    contentType: /\r\ncontent-type: ([^\r\n]*)/i.exec(head)?.[1] ?? "",
  };
}

/** Writes a request on a new connection and reads the first response, or undefined when none came. */
function sendRaw(
  port: number,
  request: { head: Buffer; body?: Buffer; isHead?: boolean },
  timeoutMs: number,
): Promise<Answer | undefined> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    let data = Buffer.alloc(0);
    let answer: Answer | undefined;
    const timer = setTimeout(() => socket.destroy(), timeoutMs);
    const settle = (a: Answer | undefined) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(a);
    };
    socket.on("data", (d) => {
      data = Buffer.concat([data, d]);
      answer = completeAnswer(data, false, request.isHead === true);
      if (answer) settle(answer);
    });
    socket.on("error", () => {});
    socket.on("close", () => settle(answer ?? completeAnswer(data, true, request.isHead === true)));
    const pump = async () => {
      socket.write(request.head);
      const body = request.body ?? Buffer.alloc(0);
      if (body.length > 1024 * 1024) {
        // Wait for 100 Continue, then a moment for a refusal made on the headers.
        for (let waited = 0; waited < 2_000 && !data.includes("100 Continue") && !answer; waited += 10) {
          await new Promise((r) => setTimeout(r, 10));
        }
        await new Promise((r) => setTimeout(r, 100));
      }
      for (let at = 0; at < body.length && !answer && !socket.destroyed; at += 64 * 1024) {
        await new Promise((r) => socket.write(body.subarray(at, at + 64 * 1024), r));
      }
    };
    socket.on("connect", () => void pump());
  });
}

interface SlowResult {
  kind: "slow headers" | "slow body" | "silent";
  cutAfterMs: number;
  limitMs: number;
  status: number | undefined;
  code: string | undefined;
}

/** A caller that connects and trickles its request a byte at a time (slowloris). */
function slowCaller(port: number, kind: SlowResult["kind"]): Promise<SlowResult> {
  return new Promise((resolve) => {
    const started = Date.now();
    const socket = connect(port, "127.0.0.1");
    const chunks: Buffer[] = [];
    let timer: NodeJS.Timeout | undefined;
    const body = '{"model":"tollgate-mini","messages":[{"role":"user","content":"slow"}]}';
    const head =
      kind === "slow body"
        ? `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`
        : "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    const trickle = kind === "slow body" ? body : "a".repeat(10_000);
    let i = 0;
    socket.on("connect", () => {
      if (kind === "silent") return;
      socket.write(head);
      timer = setInterval(() => {
        if (i < trickle.length && !socket.destroyed) socket.write(trickle[i++]!);
      }, 200);
    });
    socket.on("data", (d) => chunks.push(d));
    socket.on("error", () => {});
    socket.on("close", () => {
      clearInterval(timer);
      const text = Buffer.concat(chunks).toString("utf8");
      const status = /^HTTP\/1\.1 (\d{3})/.exec(text)?.[1];
      let code: string | undefined;
      try {
        code = (JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4)) as { error?: { code?: string } }).error
          ?.code;
      } catch {}
      resolve({
        kind,
        cutAfterMs: Date.now() - started,
        limitMs: kind === "slow body" ? REQUEST_TIMEOUT_MS : HEADERS_TIMEOUT_MS,
        status: status ? Number(status) : undefined,
        code,
      });
    });
  });
}

describe("hostile input on the public port (fuzz, all-in-one process)", () => {
  let gateway: SpawnedGateway;
  let upstream: FakeUpstream;
  let dir: string;
  let key: string;

  beforeAll(async () => {
    upstream = await startFakeUpstream({ record: true });
    dir = mkdtempSync(join(tmpdir(), "tollgate-fuzz-"));
    const demo = readFileSync(DEMO_CONFIG, "utf8");
    key = /secret: (tg_\S+)/.exec(demo)![1]!;
    writeFileSync(join(dir, "tollgate.yaml"), demo.replace(/baseUrl: \S+/, `baseUrl: ${upstream.url}`));
    gateway = await spawnAllInOne({
      TOLLGATE_CONFIG: join(dir, "tollgate.yaml"),
      TEMPO_DEVNET_PORT: "0",
      HEADERS_TIMEOUT_MS: String(HEADERS_TIMEOUT_MS),
      REQUEST_TIMEOUT_MS: String(REQUEST_TIMEOUT_MS),
      LOG_LEVEL: "warn",
    });
  });

  afterAll(async () => {
    agent.destroy();
    await gateway?.stop();
    await upstream?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it(
    "answers every hostile request with a 4xx and a code, never a 5xx or a crash, and cuts slow callers",
    async () => {
      const r = prng(SEED);
      const failures: string[] = [];
      const byCode = new Map<string, number>();
      const kinds = new Map<string, number>();
      let ok2xx = 0;
      let input5xx = 0;
      let noAnswer = 0;
      let upstreamOnRejection = 0;
      let cases = 0;
      const fail = (i: number, c: Case, why: string) => {
        if (failures.length < 20)
          failures.push(
            `case ${i} (${c.kind} ${c.method} ${c.path.slice(0, 60)}): ${why}`.replaceAll(key, "<key>"),
          );
      };

      // Slow callers run alongside the cases, a bounded few.
      const slow = Promise.all([
        slowCaller(gateway.port, "slow headers"),
        slowCaller(gateway.port, "slow headers"),
        slowCaller(gateway.port, "slow body"),
        slowCaller(gateway.port, "slow body"),
        slowCaller(gateway.port, "silent"),
      ]);

      const deadline = Date.now() + SECONDS * 1000;
      while (Date.now() < deadline && cases < MAX_CASES) {
        const i = cases++;
        const c = makeCase(r, key);
        kinds.set(c.kind, (kinds.get(c.kind) ?? 0) + 1);
        const lastSeen = upstream.requests.at(-1);
        let answer: Answer | undefined;
        try {
          const raw = c.raw
            ? { head: c.raw }
            : (c.body?.length ?? 0) > 1024 * 1024 || c.method === "HEAD"
              ? { ...asRaw(c), isHead: c.method === "HEAD" }
              : undefined;
          answer = raw
            ? await sendRaw(gateway.port, raw, REQUEST_TIMEOUT_MS + 2_000)
            : await sendHttp(gateway.port, c, REQUEST_TIMEOUT_MS + 2_000);
        } catch (err) {
          // The server may close a connection it refused to parse: that is an answer only when
          // a status came first, which sendHttp would have resolved with.
          answer = undefined;
          if (!c.raw) fail(i, c, `no answer: ${(err as Error).message}`);
        }
        if (!answer) {
          noAnswer++;
          if (c.kind !== "raw") fail(i, c, "no answer");
          continue;
        }
        const sawUpstream = upstream.requests.at(-1) !== lastSeen;
        if (answer.status >= 500) {
          input5xx++;
          fail(i, c, `status ${answer.status}: ${answer.body.slice(0, 200)}`);
          continue;
        }
        if (answer.status < 300) {
          ok2xx++;
          continue;
        }
        if (c.method === "HEAD") {
          byCode.set(
            `${answer.status} (HEAD, no body)`,
            (byCode.get(`${answer.status} (HEAD, no body)`) ?? 0) + 1,
          );
          continue;
        }
        let code: string | undefined;
        try {
          const parsed = JSON.parse(answer.body) as { code?: string; error?: { code?: string } };
          code = parsed.error?.code ?? parsed.code;
        } catch {
          fail(i, c, `status ${answer.status} without a JSON body: ${answer.body.slice(0, 100)}`);
          continue;
        }
        if (code === undefined || STATUS_BY_CODE[code] !== answer.status) {
          fail(i, c, `status ${answer.status} with code ${code}`);
          continue;
        }
        if (!/json/.test(answer.contentType)) fail(i, c, `content type ${answer.contentType}`);
        byCode.set(`${answer.status} ${code}`, (byCode.get(`${answer.status} ${code}`) ?? 0) + 1);
        if (sawUpstream && code !== "upstream_rejected") {
          upstreamOnRejection++;
          fail(i, c, `the upstream was called for a ${answer.status} ${code}`);
        }
      }

      const slowResults = await slow;
      const health = await fetch(`http://127.0.0.1:${gateway.port}/livez`).then((res) => res.status);
      const crashes = gateway.alive() ? 0 : 1;
      let pidAlive = true;
      try {
        process.kill(gateway.pid, 0);
      } catch {
        pidAlive = false;
      }

      const summary = [
        `fuzz: seed=${SEED} (replay with FUZZ_SEED=${SEED}) seconds=${SECONDS} cases=${cases}`,
        `fuzz: by kind: ${[...kinds].map(([k, n]) => `${k}=${n}`).join(" ")}`,
        `fuzz: 2xx=${ok2xx} 4xx=${[...byCode.values()].reduce((a, b) => a + b, 0)} input-caused 5xx=${input5xx} crashes=${crashes} unanswered raw=${noAnswer} upstream calls on a rejection=${upstreamOnRejection}`,
        "fuzz: 4xx by status and code:",
        ...[...byCode].sort(([a], [b]) => a.localeCompare(b)).map(([k, n]) => `fuzz:   ${k}: ${n}`),
        `fuzz: slow callers (headers timeout ${HEADERS_TIMEOUT_MS} ms, request timeout ${REQUEST_TIMEOUT_MS} ms): ${slowResults
          .map((s) => `${s.kind} cut after ${s.cutAfterMs} ms (${s.status ?? "-"} ${s.code ?? "-"})`)
          .join("; ")}`,
        `fuzz: health after the run: /livez ${health}, pid ${pidAlive ? "alive" : "gone"}`,
        ...(failures.length ? ["fuzz: failures:", ...failures.map((f) => `fuzz:   ${f}`)] : []),
      ].join("\n");
      console.log(summary);
      mkdirSync(dirname(SUMMARY_FILE), { recursive: true });
      writeFileSync(SUMMARY_FILE, `${summary}\n`);

      expect(failures).toEqual([]);
      expect({ input5xx, crashes, upstreamOnRejection, health, pidAlive }).toEqual({
        input5xx: 0,
        crashes: 0,
        upstreamOnRejection: 0,
        health: 200,
        pidAlive: true,
      });
      expect(cases).toBeGreaterThan(100);
      for (const s of slowResults) {
        // Node checks for slow callers every quarter of the shorter timeout: allow that, and 1 s.
        expect(s.cutAfterMs, s.kind).toBeLessThan(s.limitMs + HEADERS_TIMEOUT_MS / 4 + 1_000);
        if (s.kind !== "silent")
          expect({ kind: s.kind, status: s.status, code: s.code }).toEqual({
            kind: s.kind,
            status: 408,
            code: "request_timeout",
          });
      }
    },
    SECONDS * 1000 + 30_000,
  );
});
