import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** How a fake upstream behaves; every field can be changed at run time with configure(). */
export interface FakeUpstreamOptions {
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0: a free port. */
  port?: number;
  /** Ids listed by GET /v1/models and accepted by the completion routes. */
  models?: string[];
  /** Models that also produce `reasoning_content` and report reasoning tokens. */
  reasoningModels?: string[];
  /** When set, requests without `Authorization: Bearer <apiKey>` get a 401. */
  apiKey?: string;
  /** Delay before answering a buffered request. */
  latencyMs?: number;
  /** Delay before the first SSE chunk. */
  ttftMs?: number;
  /** Pacing between SSE token chunks; 0 or undefined means no pacing. */
  tokensPerSecond?: number;
  /** Tokens produced when the request has no cap; the output is min(cap, outputTokens). */
  outputTokens?: number;
  /**
   * Delay before the first byte of any completion answer (its status line), buffered or
   * streamed; `ttftMs` then still applies between a stream's headers and its first chunk.
   */
  firstByteDelayMs?: number;
  /** While set, every completion request fails this way (after any failNext() ones). */
  failure?: InjectedFailure;
  /**
   * While set, completion requests whose body contains `text` fail this way (after any
   * failNext() ones, before `failure`), as a model server that one input breaks; others are answered.
   */
  failWhen?: { text: string; failure: InjectedFailure };
}

/** One request as the fake received it. */
export interface RecordedRequest {
  method: string;
  path: string;
  headers: Record<string, string | string[] | undefined>;
  /** Parsed JSON, the raw text when it was not JSON, or undefined when empty. */
  body: unknown;
  /** For a stream: the token chunks written so far (what the upstream actually produced). */
  tokensWritten?: number;
}

/**
 * A failure to inject into the next completion requests. `hang` wins over everything; then a
 * `status` (or a failure with neither `hang` nor `afterChunks`, which means 500) answers an error.
 */
export interface InjectedFailure {
  /** Answer with this status and an OpenAI-style error body (500 when nothing else is set). */
  status?: number;
  /** Replaces the OpenAI-style error body. */
  body?: string;
  /** Sent as the Retry-After header. */
  retryAfter?: string;
  /** For streams: send this many token chunks, then destroy the socket (buffered: destroy at once). */
  afterChunks?: number;
  /** Never answer; the connection ends when the client gives up or on close(). */
  hang?: boolean;
  /** Wait this long before failing (an error status, or the cut of a buffered request). */
  delayMs?: number;
}

/** A running fake OpenAI-compatible upstream. */
export interface FakeUpstream {
  /** Base URL ending in /v1. */
  url: string;
  port: number;
  /** Every request received, oldest first; at most the last 1000. */
  requests: RecordedRequest[];
  configure(opts: Partial<FakeUpstreamOptions>): void;
  /** The next `count` completion requests fail this way. */
  failNext(count: number, failure: InjectedFailure): void;
  /** Stops listening and destroys open connections, hung ones included. */
  close(): Promise<void>;
}

/** The usage block the fake reports, in OpenAI's shape. */
export interface FakeUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  completion_tokens_details?: { reasoning_tokens: number };
}

/** What the fake answers for one request body, computed without a server. */
export interface FakeOutput {
  /** One text per choice: one per prompt on /v1/completions, exactly one on chat. */
  texts: string[];
  /** Reasoning text (chat with a reasoning model only). */
  reasoning: string | undefined;
  finishReason: "stop" | "length";
  usage: FakeUsage;
}

export const DEFAULT_MODELS: readonly string[] = ["fake-small", "fake-large", "fake-reasoner"];
export const DEFAULT_REASONING_MODELS: readonly string[] = ["fake-reasoner"];
export const DEFAULT_OUTPUT_TOKENS = 12;
/** Reasoning models think this many words before answering. */
export const REASONING_TOKENS = 4;
const MAX_RECORDED = 1_000;

// biome-ignore format: a word list reads better in rows
const VOCABULARY = [
  "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
  "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
  "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
  "yankee", "zulu", "amber", "basil", "cedar", "dune", "ember", "fjord",
];

/** "chat" is /v1/chat/completions, "completions" the legacy /v1/completions. */
export type FakeRoute = "chat" | "completions";
type Route = FakeRoute;

interface ParsedRequest {
  model: string;
  /** The texts whose hash picks the words: one entry per choice. */
  seeds: string[];
  promptTokens: number;
  cap: number | undefined;
  stream: boolean;
  includeUsage: boolean;
}

class BadRequest extends Error {
  constructor(
    readonly status: number,
    readonly type: string,
    readonly code: string | null,
    message: string,
  ) {
    super(message);
  }
}

const utf8Length = (s: string) => Buffer.byteLength(s, "utf8");
const tokensOf = (text: string) => Math.ceil(utf8Length(text) / 4) + 3;

/** FNV-1a: cheap and stable, enough to vary the words by model and prompt. */
function hash(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

function words(seed: number, n: number): string[] {
  const out = new Array<string>(n);
  let x = seed || 1;
  for (let i = 0; i < n; i++) {
    // xorshift32 keeps consecutive words from repeating a pattern.
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = VOCABULARY[(x >>> 0) % VOCABULARY.length]!;
  }
  return out;
}

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    let text = "";
    for (const part of content) {
      if (part && typeof part === "object" && (part as { type?: unknown }).type === "text") {
        const t = (part as { text?: unknown }).text;
        if (typeof t === "string") text += t;
      }
    }
    return text;
  }
  return "";
}

function capOf(body: Record<string, unknown>): number | undefined {
  const cap = body["max_tokens"] ?? body["max_completion_tokens"];
  if (cap === undefined || cap === null) return undefined;
  if (typeof cap !== "number" || !Number.isInteger(cap) || cap < 0) {
    throw new BadRequest(
      400,
      "invalid_request_error",
      "invalid_value",
      "max_tokens must be a non-negative integer",
    );
  }
  return cap;
}

function parseRequest(route: Route, body: unknown): ParsedRequest {
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new BadRequest(400, "invalid_request_error", null, "the request body must be a JSON object");
  }
  const b = body as Record<string, unknown>;
  const model = b["model"];
  if (typeof model !== "string" || model === "") {
    throw new BadRequest(400, "invalid_request_error", "missing_required_parameter", "model is required");
  }
  const seeds: string[] = [];
  let promptTokens = 0;
  if (route === "chat") {
    const messages = b["messages"];
    if (!Array.isArray(messages) || messages.length === 0) {
      throw new BadRequest(
        400,
        "invalid_request_error",
        "missing_required_parameter",
        "messages is required",
      );
    }
    let all = model;
    for (const m of messages) {
      const text = contentText(m && typeof m === "object" ? (m as { content?: unknown }).content : undefined);
      promptTokens += tokensOf(text);
      all += "\n" + text;
    }
    seeds.push(all);
  } else {
    const prompt = b["prompt"];
    const prompts = typeof prompt === "string" ? [prompt] : prompt;
    if (!Array.isArray(prompts) || prompts.length === 0 || !prompts.every((p) => typeof p === "string")) {
      throw new BadRequest(
        400,
        "invalid_request_error",
        "invalid_value",
        "prompt must be a string or a non-empty array of strings",
      );
    }
    for (const p of prompts as string[]) {
      promptTokens += tokensOf(p);
      seeds.push(model + "\n" + p);
    }
  }
  const streamOptions = b["stream_options"];
  return {
    model,
    seeds,
    promptTokens,
    cap: capOf(b),
    stream: b["stream"] === true,
    includeUsage:
      !!streamOptions &&
      typeof streamOptions === "object" &&
      (streamOptions as { include_usage?: unknown }).include_usage === true,
  };
}

function outputOf(route: Route, req: ParsedRequest, outputTokens: number, reasoning: boolean): FakeOutput {
  const n = Math.min(req.cap ?? outputTokens, outputTokens);
  const withReasoning = reasoning && route === "chat";
  const texts = req.seeds.map((seed) => textOf(words(hash(seed), n)));
  const reasoningTokens = withReasoning ? REASONING_TOKENS : 0;
  const completionTokens = n * req.seeds.length + reasoningTokens;
  const usage: FakeUsage = {
    prompt_tokens: req.promptTokens,
    completion_tokens: completionTokens,
    total_tokens: req.promptTokens + completionTokens,
  };
  if (withReasoning) usage.completion_tokens_details = { reasoning_tokens: reasoningTokens };
  return {
    texts,
    reasoning: withReasoning
      ? textOf(words(hash("reasoning\n" + req.seeds[0]), REASONING_TOKENS))
      : undefined,
    finishReason: n < outputTokens ? "length" : "stop",
    usage,
  };
}

/** Each word is one token and is streamed as "word "; the buffered text is the same concatenation. */
function textOf(ws: readonly string[]): string {
  let s = "";
  for (const w of ws) s += w + " ";
  return s;
}

/**
 * What the fake answers for a request body on /v1/chat/completions (`route: "chat"`) or
 * /v1/completions: the texts, finish reason and usage, for asserting on what a gateway relays.
 */
export function expectedOutput(
  body: unknown,
  opts: Pick<FakeUpstreamOptions, "outputTokens" | "reasoningModels"> & { route?: Route } = {},
): FakeOutput {
  const route = opts.route ?? "chat";
  const req = parseRequest(route, body);
  const reasoning = (opts.reasoningModels ?? DEFAULT_REASONING_MODELS).includes(req.model);
  return outputOf(route, req, opts.outputTokens ?? DEFAULT_OUTPUT_TOKENS, reasoning);
}

/** The usage the fake reports for a request body (see expectedOutput). */
export function expectedUsage(
  body: unknown,
  opts: Pick<FakeUpstreamOptions, "outputTokens" | "reasoningModels"> & { route?: Route } = {},
): FakeUsage {
  return expectedOutput(body, opts).usage;
}

function errorBody(message: string, type: string, code: string | null): string {
  return JSON.stringify({ error: { message, type, param: null, code } });
}

function sendJson(
  res: ServerResponse,
  status: number,
  payload: string,
  extra?: Record<string, string>,
): void {
  if (gone(res)) return;
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
    ...extra,
  });
  res.end(payload);
}

/** True once the client went away or the answer is complete: nothing more may be written. */
function gone(res: ServerResponse): boolean {
  return res.destroyed || res.writableEnded || !res.socket || res.socket.destroyed;
}

/** Waits `ms`, or less when the connection closes first. */
function sleep(ms: number, res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    if (gone(res)) return resolve();
    const done = () => {
      clearTimeout(timer);
      res.off("close", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    res.once("close", done);
  });
}

/** Writes and resolves once the bytes are handed to the socket, so a following destroy() cannot drop them. */
function writeFlushed(res: ServerResponse, data: string): Promise<void> {
  return new Promise((resolve) => {
    if (gone(res)) return resolve();
    res.write(data, () => resolve());
  });
}

interface State {
  models: Set<string>;
  reasoningModels: Set<string>;
  modelsBody: string;
  authorization: string | undefined;
  latencyMs: number;
  ttftMs: number;
  tokenIntervalMs: number;
  outputTokens: number;
  firstByteDelayMs: number;
}

function stateOf(o: FakeUpstreamOptions): State {
  const models = o.models ?? [...DEFAULT_MODELS];
  const created = Math.floor(Date.now() / 1000);
  return {
    models: new Set(models),
    reasoningModels: new Set(o.reasoningModels ?? DEFAULT_REASONING_MODELS),
    modelsBody: JSON.stringify({
      object: "list",
      data: models.map((id) => ({ id, object: "model", created, owned_by: "fake" })),
    }),
    authorization: o.apiKey === undefined ? undefined : `Bearer ${o.apiKey}`,
    latencyMs: o.latencyMs ?? 0,
    ttftMs: o.ttftMs ?? 0,
    tokenIntervalMs: o.tokensPerSecond && o.tokensPerSecond > 0 ? 1000 / o.tokensPerSecond : 0,
    outputTokens: o.outputTokens ?? DEFAULT_OUTPUT_TOKENS,
    firstByteDelayMs: o.firstByteDelayMs ?? 0,
  };
}

/** Starts a fake OpenAI-compatible upstream on plain node:http: deterministic output, injectable failures. */
export async function startFakeUpstream(opts: FakeUpstreamOptions = {}): Promise<FakeUpstream> {
  let options: FakeUpstreamOptions = { ...opts };
  let state = stateOf(options);
  const requests: RecordedRequest[] = [];
  const failures: InjectedFailure[] = [];
  const idPrefix = randomBytes(4).toString("hex");
  let nextId = 0;

  function record(req: IncomingMessage, path: string, body: unknown): RecordedRequest {
    const entry: RecordedRequest = { method: req.method ?? "", path, headers: req.headers, body };
    requests.push(entry);
    if (requests.length > MAX_RECORDED) requests.shift();
    return entry;
  }

  async function answer(req: IncomingMessage, res: ServerResponse, path: string, raw: string): Promise<void> {
    const route: Route | undefined =
      path === "/v1/chat/completions" ? "chat" : path === "/v1/completions" ? "completions" : undefined;

    let body: unknown;
    let invalidJson = false;
    if (raw.length > 0) {
      try {
        body = JSON.parse(raw);
      } catch {
        body = raw;
        invalidJson = true;
      }
    }
    const recorded = record(req, path, body);

    if (state.authorization !== undefined && req.headers.authorization !== state.authorization) {
      sendJson(
        res,
        401,
        errorBody("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
      );
      return;
    }

    if (req.method === "GET" && path === "/v1/models") {
      sendJson(res, 200, state.modelsBody);
      return;
    }
    if (req.method === "GET" && path.startsWith("/v1/models/")) {
      const id = decodeURIComponent(path.slice("/v1/models/".length));
      if (state.models.has(id)) {
        sendJson(res, 200, JSON.stringify({ id, object: "model", created: 0, owned_by: "fake" }));
      } else {
        sendJson(
          res,
          404,
          errorBody(`The model \`${id}\` does not exist`, "invalid_request_error", "model_not_found"),
        );
      }
      return;
    }
    if (req.method !== "POST" || route === undefined) {
      sendJson(
        res,
        404,
        errorBody(`Unknown route ${req.method} ${path}`, "invalid_request_error", "unknown_url"),
      );
      return;
    }

    // An injected failure replaces the answer whatever the body says, as a broken upstream would.
    const failure = failures.shift() ?? failureFor(options.failWhen, raw) ?? options.failure;
    if (failure?.hang) return;
    const firstByteDelay = (failure?.delayMs ?? 0) + state.firstByteDelayMs;
    if (firstByteDelay > 0) {
      await sleep(firstByteDelay, res);
      if (gone(res)) return;
    }
    if (failure && (failure.status !== undefined || failure.afterChunks === undefined)) {
      const status = failure.status ?? 500;
      const type = status >= 500 ? "server_error" : "invalid_request_error";
      const code = status === 429 ? "rate_limit_exceeded" : null;
      const text = failure.body ?? errorBody(`injected failure (status ${status})`, type, code);
      sendJson(
        res,
        status,
        text,
        failure.retryAfter !== undefined ? { "retry-after": failure.retryAfter } : undefined,
      );
      return;
    }
    if (invalidJson) {
      sendJson(res, 400, errorBody("The request body is not valid JSON.", "invalid_request_error", null));
      return;
    }
    let parsed: ParsedRequest;
    try {
      parsed = parseRequest(route, body);
    } catch (err) {
      if (!(err instanceof BadRequest)) throw err;
      sendJson(res, err.status, errorBody(err.message, err.type, err.code));
      return;
    }
    if (failure && !parsed.stream) {
      // afterChunks on a buffered request: the connection dies before any answer.
      req.socket.destroy();
      return;
    }
    if (!state.models.has(parsed.model)) {
      sendJson(
        res,
        404,
        errorBody(`The model \`${parsed.model}\` does not exist`, "invalid_request_error", "model_not_found"),
      );
      return;
    }

    const s = state;
    const output = outputOf(route, parsed, s.outputTokens, s.reasoningModels.has(parsed.model));
    const created = Math.floor(Date.now() / 1000);
    const id = `${route === "chat" ? "chatcmpl" : "cmpl"}-${idPrefix}${(nextId++).toString(16)}`;

    if (!parsed.stream) {
      if (s.latencyMs > 0) {
        await sleep(s.latencyMs, res);
        if (gone(res)) return;
      }
      sendJson(res, 200, bufferedBody(route, id, created, parsed.model, output));
      return;
    }
    await stream(res, route, id, created, parsed, output, s, failure?.afterChunks, recorded);
  }

  const server = createServer((req, res) => {
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q === -1 ? url : url.slice(0, q);
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const raw = chunks.length === 1 ? chunks[0]!.toString() : Buffer.concat(chunks).toString();
      answer(req, res, path, raw).catch((err: unknown) => {
        if (!res.headersSent) {
          sendJson(res, 500, errorBody(`fake upstream error: ${String(err)}`, "server_error", null));
        } else {
          res.destroy();
        }
      });
    });
    // A client that disconnects mid-answer is normal here, not an error.
    req.on("error", () => {});
    res.on("error", () => {});
  });
  // Longer than any client's idle timeout, so a benchmark never reuses a socket the fake is closing.
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const host = options.host ?? "127.0.0.1";

  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${port}/v1`,
    port,
    requests,
    configure(next) {
      options = { ...options, ...next };
      state = stateOf(options);
    },
    failNext(count, failure) {
      for (let i = 0; i < count; i++) failures.push(failure);
    },
    close() {
      return new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}

/** The failure a `failWhen` trigger sets for this raw request body, if it matches. */
function failureFor(when: FakeUpstreamOptions["failWhen"], raw: string): InjectedFailure | undefined {
  return when && raw.includes(when.text) ? when.failure : undefined;
}

function bufferedBody(route: Route, id: string, created: number, model: string, output: FakeOutput): string {
  if (route === "chat") {
    const message: Record<string, string> = { role: "assistant", content: output.texts[0] ?? "" };
    if (output.reasoning !== undefined) message["reasoning_content"] = output.reasoning;
    return JSON.stringify({
      id,
      object: "chat.completion",
      created,
      model,
      choices: [{ index: 0, message, logprobs: null, finish_reason: output.finishReason }],
      usage: output.usage,
    });
  }
  return JSON.stringify({
    id,
    object: "text_completion",
    created,
    model,
    choices: output.texts.map((text, index) => ({
      index,
      text,
      logprobs: null,
      finish_reason: output.finishReason,
    })),
    usage: output.usage,
  });
}

async function stream(
  res: ServerResponse,
  route: Route,
  id: string,
  created: number,
  req: ParsedRequest,
  output: FakeOutput,
  s: State,
  cutAfter: number | undefined,
  recorded?: RecordedRequest,
): Promise<void> {
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    connection: "keep-alive",
  });
  if (s.ttftMs > 0) {
    await sleep(s.ttftMs, res);
    if (gone(res)) return;
  }

  const object = route === "chat" ? "chat.completion.chunk" : "text_completion";
  const head = `{"id":"${id}","object":"${object}","created":${created},"model":${JSON.stringify(req.model)},"choices":`;
  const event = (choices: string) => `data: ${head}${choices}}\n\n`;
  const chat = (delta: Record<string, string>, finish: string | null) =>
    event(
      `[{"index":0,"delta":${JSON.stringify(delta)},"logprobs":null,"finish_reason":${JSON.stringify(finish)}}]`,
    );
  const text = (index: number, t: string, finish: string | null) =>
    event(
      `[{"index":${index},"text":${JSON.stringify(t)},"logprobs":null,"finish_reason":${JSON.stringify(finish)}}]`,
    );

  const first = route === "chat" ? chat({ role: "assistant", content: "" }, null) : "";
  // One chunk per token, reasoning first; pacing applies between them.
  const tokens: string[] = [];
  if (route === "chat") {
    for (const w of splitWords(output.reasoning)) tokens.push(chat({ reasoning_content: w }, null));
    for (const w of splitWords(output.texts[0])) tokens.push(chat({ content: w }, null));
  } else {
    output.texts.forEach((t, index) => {
      for (const w of splitWords(t)) tokens.push(text(index, w, null));
    });
  }
  const count = cutAfter === undefined ? tokens.length : Math.min(cutAfter, tokens.length);

  let tail = "";
  if (cutAfter === undefined) {
    if (route === "chat") tail += chat({}, output.finishReason);
    else
      for (let index = 0; index < output.texts.length; index++) tail += text(index, "", output.finishReason);
    if (req.includeUsage) tail += `data: ${head}[],"usage":${JSON.stringify(output.usage)}}\n\n`;
    tail += "data: [DONE]\n\n";
  }

  if (s.tokenIntervalMs === 0) {
    // Nothing to pace: a single write keeps the benchmark's fake cheap.
    const all = first + (count === tokens.length ? tokens.join("") : tokens.slice(0, count).join(""));
    if (cutAfter === undefined) {
      res.end(all + tail);
      return;
    }
    await writeFlushed(res, all);
    if (recorded) recorded.tokensWritten = count;
  } else {
    await writeFlushed(res, first);
    for (let i = 0; i < count; i++) {
      if (i > 0) await sleep(s.tokenIntervalMs, res);
      if (gone(res)) return;
      await writeFlushed(res, tokens[i]!);
      if (recorded) recorded.tokensWritten = i + 1;
    }
    if (cutAfter === undefined) {
      if (!gone(res)) res.end(tail);
      return;
    }
  }
  // An injected cut: the bytes so far are on the wire, then the connection dies mid-stream.
  res.socket?.destroy();
}

/** "a b c " → ["a ", "b ", "c "]: each word keeps its trailing space, as it is streamed. */
function splitWords(text: string | undefined): string[] {
  if (!text) return [];
  return text.match(/[^ ]+ /g) ?? [];
}
