import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { jsonAnswerOf, jsonTokens, ResponseFormatError } from "./fake-json.js";

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
   * Keep every request (method, path, headers, parsed body), the last 1000, in `requests`.
   * Off by default: bodies can be megabytes and headers carry keys, so only a test that reads
   * `requests` turns it on; the all-in-one demo and the standalone fake never do.
   */
  record?: boolean;
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
  /**
   * Answer with this status and an OpenAI-style error body (500 when nothing else is set); on
   * /v1/messages an Anthropic-style one, its error type the status's (529: overloaded_error).
   */
  status?: number;
  /** Replaces the OpenAI-style error body. */
  body?: string;
  /** Sent as the Retry-After header. */
  retryAfter?: string;
  /** For streams: send this many token chunks, then destroy the socket (buffered: destroy at once). */
  afterChunks?: number;
  /**
   * /v1/messages streams only: after `afterChunks` text deltas (0 when unset), send an `error`
   * event of this Anthropic error type (e.g. "overloaded_error") and end the stream.
   */
  errorEvent?: string;
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
  /**
   * Every request received, oldest first; at most the last 1000. Only with `record: true`:
   * reading it otherwise throws, so a test that counts requests without recording fails
   * instead of comparing two lengths of an empty list.
   */
  readonly requests: RecordedRequest[];
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
  /**
   * One text per returned choice, in index order: `n` on chat; on /v1/completions `n` per
   * prompt, choice `prompt_index * n + j` as vLLM numbers them.
   */
  texts: string[];
  /** Reasoning text of choice 0 (chat with a reasoning model only). */
  reasoning: string | undefined;
  /** Reasoning text of every choice, in index order; empty without reasoning. */
  reasonings: string[];
  /** The same for every choice: "length" when the cap cut the output. */
  finishReason: "stop" | "length";
  usage: FakeUsage;
}

export const DEFAULT_MODELS: readonly string[] = ["fake-small", "fake-large", "fake-reasoner", "fake-embed"];
/** The vector length of POST /v1/embeddings when the request names no `dimensions`. */
export const DEFAULT_EMBEDDING_DIMENSIONS = 256;
/** The most `dimensions` the fake computes. */
const MAX_EMBEDDING_DIMENSIONS = 4096;
export const DEFAULT_REASONING_MODELS: readonly string[] = ["fake-reasoner"];
export const DEFAULT_OUTPUT_TOKENS = 12;
/** Reasoning models think this many words before answering. */
export const REASONING_TOKENS = 4;
const MAX_RECORDED = 1_000;
/**
 * Sequences one request may ask for (prompts × best_of, or n): vLLM has no such bound, the
 * fake has it so that a fuzzed `n` cannot make it build millions of strings.
 */
export const MAX_SEQUENCES = 1_024;

// biome-ignore format: a word list reads better in rows
const VOCABULARY = [
  "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
  "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
  "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
  "yankee", "zulu", "amber", "basil", "cedar", "dune", "ember", "fjord",
];

/**
 * "chat" is /v1/chat/completions, "completions" the legacy /v1/completions, "messages"
 * Anthropic's /v1/messages (the same words and token counts as chat for the same conversation,
 * the system prompt counted as chat counts a system message).
 */
export type FakeRoute = "chat" | "completions" | "messages";
type Route = FakeRoute;

interface ParsedRequest {
  model: string;
  /** The texts whose hash picks the words: one entry per prompt (chat: one). */
  seeds: string[];
  /** Prompt tokens of each prompt (chat: one entry, all messages). */
  promptTokens: number[];
  /** Output tokens per choice at most (max_tokens, else max_completion_tokens). */
  cap: number | undefined;
  /** Choices returned per prompt. */
  n: number;
  /** Sequences generated per prompt: best_of on /v1/completions, else n. */
  generated: number;
  stream: boolean;
  includeUsage: boolean;
  /** vLLM's stream_options.continuous_usage_stats (with include_usage): usage on every chunk. */
  continuousUsage: boolean;
  /** Chat with a JSON `response_format`: the JSON every choice answers (fake-json.ts). */
  json?: string;
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

/**
 * The output cap of each choice. Either field caps; when both are sent, max_tokens wins, so a
 * gateway that caps only max_completion_tokens and forwards a larger max_tokens is caught.
 * (vLLM's own request models read `max_completion_tokens or max_tokens`: a gateway must cap
 * both fields to be safe behind either reading.)
 */
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

/** An optional positive integer field, `fallback` when absent. */
function countOf(body: Record<string, unknown>, field: string, fallback: number): number {
  const value = body[field];
  if (value === undefined || value === null) return fallback;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 1) {
    throw new BadRequest(
      400,
      "invalid_request_error",
      "invalid_value",
      `${field} must be a positive integer`,
    );
  }
  return value;
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
  const promptTokens: number[] = [];
  let json: string | undefined;
  if (route === "messages") return parseMessagesRequest(model, b);
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
    let tokens = 0;
    for (const m of messages) {
      const text = contentText(m && typeof m === "object" ? (m as { content?: unknown }).content : undefined);
      tokens += tokensOf(text);
      all += "\n" + text;
    }
    seeds.push(all);
    promptTokens.push(tokens);
    json = jsonOf(b["response_format"], all);
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
      promptTokens.push(tokensOf(p));
      seeds.push(model + "\n" + p);
    }
  }
  const n = countOf(b, "n", 1);
  // best_of exists on /v1/completions only; vLLM refuses one below n.
  const generated = route === "completions" ? countOf(b, "best_of", n) : n;
  if (generated < n) {
    throw new BadRequest(
      400,
      "invalid_request_error",
      "invalid_value",
      "best_of must be greater than or equal to n",
    );
  }
  if (seeds.length * generated > MAX_SEQUENCES) {
    throw new BadRequest(
      400,
      "invalid_request_error",
      "invalid_value",
      `the fake upstream generates at most ${MAX_SEQUENCES} sequences per request`,
    );
  }
  const streamOptions = b["stream_options"];
  const option = (name: string) =>
    !!streamOptions &&
    typeof streamOptions === "object" &&
    (streamOptions as Record<string, unknown>)[name] === true;
  const includeUsage = option("include_usage");
  return {
    model,
    seeds,
    promptTokens,
    cap: capOf(b),
    n,
    generated,
    stream: b["stream"] === true,
    includeUsage,
    continuousUsage: includeUsage && option("continuous_usage_stats"),
    ...(json !== undefined ? { json } : {}),
  };
}

/**
 * The JSON a chat `response_format` asks for (undefined for text), its strings words of the
 * vocabulary picked by the prompt and the property's name; a format it cannot answer is a 400.
 */
function jsonOf(responseFormat: unknown, seed: string): string | undefined {
  try {
    return jsonAnswerOf(responseFormat, (key) => words(hash(`${seed}\n${key}`), 1)[0]!);
  } catch (err) {
    if (!(err instanceof ResponseFormatError)) throw err;
    throw new BadRequest(400, "invalid_request_error", "invalid_value", err.message);
  }
}

/**
 * An Anthropic Messages request: `max_tokens` required, `system` (a string or text blocks, each
 * block counted as a chat system message) before the messages, one choice.
 */
function parseMessagesRequest(model: string, b: Record<string, unknown>): ParsedRequest {
  const messages = b["messages"];
  if (!Array.isArray(messages) || messages.length === 0) {
    throw new BadRequest(400, "invalid_request_error", null, "messages: field required");
  }
  const cap = b["max_tokens"];
  if (typeof cap !== "number" || !Number.isInteger(cap) || cap < 1) {
    throw new BadRequest(400, "invalid_request_error", null, "max_tokens: field required");
  }
  const system = b["system"];
  const texts: string[] =
    typeof system === "string"
      ? [system]
      : Array.isArray(system)
        ? system.map((block) => contentText([block]))
        : [];
  for (const m of messages) {
    const role = m && typeof m === "object" ? (m as { role?: unknown }).role : undefined;
    if (role !== "user" && role !== "assistant") {
      throw new BadRequest(400, "invalid_request_error", null, "messages: roles must be user or assistant");
    }
    texts.push(contentText((m as { content?: unknown }).content));
  }
  let all = model;
  let tokens = 0;
  for (const text of texts) {
    tokens += tokensOf(text);
    all += "\n" + text;
  }
  return {
    model,
    seeds: [all],
    promptTokens: [tokens],
    cap,
    n: 1,
    generated: 1,
    stream: b["stream"] === true,
    includeUsage: false,
    continuousUsage: false,
  };
}

/** The seed of choice `j` of a prompt: choice 0 keeps the prompt's own, as before `n` existed. */
function choiceSeed(seed: string, j: number): string {
  return j === 0 ? seed : `${seed}\u0000${j}`;
}

/**
 * The answer to a parsed request. Each choice produces min(cap, outputTokens) tokens of its own
 * words (reasoning models first think REASONING_TOKENS of them on chat, within the cap). Usage is vLLM's:
 * prompt_tokens counts each prompt once whatever `n`; completion_tokens counts every sequence
 * generated, which with best_of > n includes the best_of − n sequences generated and not
 * returned (the conservative reading of what an upstream bills).
 */
function outputOf(route: Route, req: ParsedRequest, outputTokens: number, reasoning: boolean): FakeOutput {
  // A JSON answer is as long as its JSON, one token per piece (fake-json.ts), cut by the cap alone.
  const json = req.json === undefined ? undefined : jsonTokens(req.json);
  const whole = json?.length ?? outputTokens;
  const withReasoning = reasoning && route === "chat";
  // The cap bounds everything a sequence generates, its reasoning included (as vLLM's max_tokens
  // and OpenAI's max_completion_tokens do): reasoning first, the answer in what is left.
  const thinking = withReasoning ? Math.min(REASONING_TOKENS, req.cap ?? REASONING_TOKENS) : 0;
  const perChoice = Math.min(req.cap === undefined ? whole : req.cap - thinking, whole);
  const texts: string[] = [];
  const reasonings: string[] = [];
  for (const seed of req.seeds) {
    for (let j = 0; j < req.n; j++) {
      const s = choiceSeed(seed, j);
      texts.push(json ? json.slice(0, perChoice).join("") : textOf(words(hash(s), perChoice)));
      if (withReasoning) reasonings.push(textOf(words(hash("reasoning\n" + s), thinking)));
    }
  }
  const sequences = req.seeds.length * req.generated;
  const reasoningTokens = thinking * sequences;
  const completionTokens = perChoice * sequences + reasoningTokens;
  const promptTokens = req.promptTokens.reduce((sum, t) => sum + t, 0);
  const usage: FakeUsage = {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
  };
  if (withReasoning) usage.completion_tokens_details = { reasoning_tokens: reasoningTokens };
  return {
    texts,
    reasoning: reasonings[0],
    reasonings,
    finishReason: perChoice < whole ? "length" : "stop",
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

const ID_PREFIXES = { chat: "chatcmpl-", completions: "cmpl-", messages: "msg_" } as const satisfies Record<
  Route,
  string
>;

/** The Anthropic error type of each status the Messages API answers. */
function anthropicErrorType(status: number): string {
  const types: Record<number, string> = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
  };
  return types[status] ?? (status >= 500 ? "api_error" : "invalid_request_error");
}

function anthropicErrorBody(message: string, type: string): string {
  return JSON.stringify({ type: "error", error: { type, message } });
}

/** The Messages API's stop reason of a fake answer. */
function stopReasonOf(output: FakeOutput): string {
  return output.finishReason === "length" ? "max_tokens" : "end_turn";
}

/** A buffered /v1/messages answer: one text block, its usage in Anthropic's shape. */
function messageBody(id: string, model: string, output: FakeOutput): Record<string, unknown> {
  return {
    id,
    type: "message",
    role: "assistant",
    model,
    content: [{ type: "text", text: output.texts[0] ?? "" }],
    stop_reason: stopReasonOf(output),
    stop_sequence: null,
    usage: { input_tokens: output.usage.prompt_tokens, output_tokens: output.usage.completion_tokens },
  };
}

/**
 * Streams a /v1/messages answer as the Messages API does: message_start (with the input tokens),
 * content_block_start, a ping, one text_delta per token (paced as chat is), content_block_stop,
 * message_delta with the stop reason and output tokens, message_stop. An injected cut destroys
 * the socket after `afterChunks` deltas; an injected `errorEvent` sends that error event there
 * and ends the stream.
 */
async function streamMessage(
  res: ServerResponse,
  id: string,
  req: ParsedRequest,
  output: FakeOutput,
  s: State,
  failure: InjectedFailure | undefined,
  recorded?: RecordedRequest,
): Promise<void> {
  startSse(res);
  const event = (type: string, data: Record<string, unknown>) =>
    `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
  const usage = output.usage;
  const first =
    event("message_start", {
      message: {
        id,
        type: "message",
        role: "assistant",
        model: req.model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: usage.prompt_tokens, output_tokens: 1 },
      },
    }) +
    event("content_block_start", { index: 0, content_block: { type: "text", text: "" } }) +
    event("ping", {});
  await writeFlushed(res, first);
  if (s.ttftMs > 0) {
    await sleep(s.ttftMs, res);
    if (gone(res)) return;
  }
  const deltas = splitWords(output.texts[0]).map((text) =>
    event("content_block_delta", { index: 0, delta: { type: "text_delta", text } }),
  );
  const cutAfter = failure?.afterChunks ?? (failure?.errorEvent !== undefined ? 0 : undefined);
  const count = cutAfter === undefined ? deltas.length : Math.min(cutAfter, deltas.length);
  for (let i = 0; i < count; i++) {
    if (i > 0 && s.tokenIntervalMs > 0) await sleep(s.tokenIntervalMs, res);
    if (gone(res)) return;
    await writeFlushed(res, deltas[i]!);
    if (recorded) recorded.tokensWritten = i + 1;
  }
  if (gone(res)) return;
  if (failure?.errorEvent !== undefined) {
    res.end(event("error", { error: { type: failure.errorEvent, message: "injected error event" } }));
    return;
  }
  if (cutAfter !== undefined) {
    res.socket?.destroy();
    return;
  }
  res.end(
    event("content_block_stop", { index: 0 }) +
      event("message_delta", {
        delta: { stop_reason: stopReasonOf(output), stop_sequence: null },
        usage: { output_tokens: usage.completion_tokens },
      }) +
      event("message_stop", {}),
  );
}

/**
 * The 200 head of an event stream, sent at once, before the first token as an inference server
 * sends it (Node would otherwise hold it back until the first chunk): `ttftMs` runs after it.
 */
function startSse(res: ServerResponse): void {
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    connection: "keep-alive",
  });
  res.flushHeaders();
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
  apiKey: string | undefined;
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
    apiKey: o.apiKey,
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

  function record(req: IncomingMessage, path: string, body: unknown): RecordedRequest | undefined {
    if (!options.record) return undefined;
    const entry: RecordedRequest = { method: req.method ?? "", path, headers: req.headers, body };
    requests.push(entry);
    if (requests.length > MAX_RECORDED) requests.shift();
    return entry;
  }

  async function answer(req: IncomingMessage, res: ServerResponse, path: string, raw: string): Promise<void> {
    const route: Route | "embeddings" | undefined =
      path === "/v1/chat/completions"
        ? "chat"
        : path === "/v1/completions"
          ? "completions"
          : path === "/v1/embeddings"
            ? "embeddings"
            : path === "/v1/messages"
              ? "messages"
              : undefined;
    // Anthropic's route answers errors in Anthropic's shape.
    const fail = (status: number, message: string, type: string, code: string | null) =>
      sendJson(
        res,
        status,
        route === "messages"
          ? anthropicErrorBody(message, anthropicErrorType(status))
          : errorBody(message, type, code),
      );

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

    const authorized =
      route === "messages"
        ? state.apiKey === undefined || req.headers["x-api-key"] === state.apiKey
        : state.authorization === undefined || req.headers.authorization === state.authorization;
    if (!authorized) {
      fail(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key");
      return;
    }
    if (route === "messages" && req.headers["anthropic-version"] === undefined) {
      fail(400, "anthropic-version: header is required", "invalid_request_error", null);
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
    const cutOnly = failure?.afterChunks !== undefined || failure?.errorEvent !== undefined;
    if (failure && (failure.status !== undefined || !cutOnly)) {
      const status = failure.status ?? 500;
      const type = status >= 500 ? "server_error" : "invalid_request_error";
      const code = status === 429 ? "rate_limit_exceeded" : null;
      const text =
        failure.body ??
        (route === "messages"
          ? anthropicErrorBody(`injected failure (status ${status})`, anthropicErrorType(status))
          : errorBody(`injected failure (status ${status})`, type, code));
      sendJson(
        res,
        status,
        text,
        failure.retryAfter !== undefined ? { "retry-after": failure.retryAfter } : undefined,
      );
      return;
    }
    if (invalidJson) {
      fail(400, "The request body is not valid JSON.", "invalid_request_error", null);
      return;
    }
    if (route === "embeddings") {
      if (failure) {
        // afterChunks on a request that never streams: the connection dies before any answer.
        req.socket.destroy();
        return;
      }
      let answerText: string;
      try {
        const asked = parseEmbeddingsRequest(body);
        if (!state.models.has(asked.model)) {
          throw new BadRequest(
            404,
            "invalid_request_error",
            "model_not_found",
            `The model \`${asked.model}\` does not exist`,
          );
        }
        answerText = JSON.stringify(embeddingsAnswer(asked));
      } catch (err) {
        if (!(err instanceof BadRequest)) throw err;
        sendJson(res, err.status, errorBody(err.message, err.type, err.code));
        return;
      }
      if (state.latencyMs > 0) {
        await sleep(state.latencyMs, res);
        if (gone(res)) return;
      }
      sendJson(res, 200, answerText);
      return;
    }
    let parsed: ParsedRequest;
    try {
      parsed = parseRequest(route, body);
    } catch (err) {
      if (!(err instanceof BadRequest)) throw err;
      fail(err.status, err.message, err.type, err.code);
      return;
    }
    if (failure && !parsed.stream) {
      // afterChunks on a buffered request: the connection dies before any answer.
      req.socket.destroy();
      return;
    }
    if (!state.models.has(parsed.model)) {
      fail(404, `The model \`${parsed.model}\` does not exist`, "invalid_request_error", "model_not_found");
      return;
    }

    const s = state;
    const output = outputOf(route, parsed, s.outputTokens, s.reasoningModels.has(parsed.model));
    const created = Math.floor(Date.now() / 1000);
    const id = `${ID_PREFIXES[route]}${idPrefix}${(nextId++).toString(16)}`;
    if (route === "messages") {
      if (!parsed.stream) {
        if (s.latencyMs > 0) {
          await sleep(s.latencyMs, res);
          if (gone(res)) return;
        }
        sendJson(res, 200, JSON.stringify(messageBody(id, parsed.model, output)));
        return;
      }
      await streamMessage(res, id, parsed, output, s, failure, recorded);
      return;
    }

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
    get requests(): RecordedRequest[] {
      if (!options.record) {
        throw new Error("this fake upstream records no requests: start it with { record: true }");
      }
      return requests;
    },
    configure(next) {
      options = { ...options, ...next };
      state = stateOf(options);
      // Turning recording off lets go of what was kept.
      if (!options.record) requests.length = 0;
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

/** A POST /v1/embeddings request as the fake reads it. */
export interface EmbeddingsAsked {
  model: string;
  /** Each input: its text, or its token ids. */
  inputs: (string | number[])[];
  dimensions: number;
  encoding: "float" | "base64";
}

function parseEmbeddingsRequest(body: unknown): EmbeddingsAsked {
  const bad = (message: string) => new BadRequest(400, "invalid_request_error", "invalid_value", message);
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new BadRequest(400, "invalid_request_error", null, "the request body must be a JSON object");
  }
  const b = body as Record<string, unknown>;
  const model = b["model"];
  if (typeof model !== "string" || model === "") {
    throw new BadRequest(400, "invalid_request_error", "missing_required_parameter", "model is required");
  }
  const input = b["input"];
  const isTokens = (v: unknown): v is number[] =>
    Array.isArray(v) &&
    v.length > 0 &&
    v.every((t) => typeof t === "number" && Number.isInteger(t) && t >= 0);
  let inputs: (string | number[])[];
  if (typeof input === "string") inputs = [input];
  else if (isTokens(input)) inputs = [input];
  else if (
    Array.isArray(input) &&
    input.length > 0 &&
    input.every((i) => typeof i === "string" || isTokens(i))
  )
    inputs = input as (string | number[])[];
  else throw bad("input must be a string, an array of strings, or token arrays");
  if (inputs.some((i) => i.length === 0)) throw bad("an input must not be empty");
  const dimensions = countOf(b, "dimensions", DEFAULT_EMBEDDING_DIMENSIONS);
  if (dimensions > MAX_EMBEDDING_DIMENSIONS)
    throw bad(`dimensions must be at most ${MAX_EMBEDDING_DIMENSIONS}`);
  const format = b["encoding_format"] ?? "float";
  if (format !== "float" && format !== "base64") throw bad("encoding_format must be float or base64");
  return { model, inputs, dimensions, encoding: format };
}

/**
 * The fake's embedding of one input: a unit vector of `dimensions` numbers drawn from a hash of
 * the model and the input, so the same input always embeds the same way.
 */
export function fakeEmbedding(model: string, input: string | number[], dimensions: number): number[] {
  let x = hash(`${model}\n${typeof input === "string" ? input : `tokens:${input.join(",")}`}`) || 1;
  const v = new Array<number>(dimensions);
  let norm = 0;
  for (let i = 0; i < dimensions; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    v[i] = ((x >>> 0) / 0xffffffff) * 2 - 1;
    norm += v[i]! * v[i]!;
  }
  const scale = norm > 0 ? 1 / Math.sqrt(norm) : 1;
  // Rounded to float32, so the float and base64 encodings of one input agree exactly.
  return v.map((c) => Math.fround(c * scale));
}

/** Prompt tokens of one input: counted as the chat prompt's, or one per token id. */
export function embeddingInputTokens(input: string | number[]): number {
  return typeof input === "string" ? tokensOf(input) : input.length;
}

/** The fake's answer to a POST /v1/embeddings request, as OpenAI shapes it. */
function embeddingsAnswer(asked: EmbeddingsAsked): Record<string, unknown> {
  const data = asked.inputs.map((input, index) => {
    const v = fakeEmbedding(asked.model, input, asked.dimensions);
    const embedding =
      asked.encoding === "base64" ? Buffer.from(new Float32Array(v).buffer).toString("base64") : v;
    return { object: "embedding", index, embedding };
  });
  const tokens = asked.inputs.reduce((sum, input) => sum + embeddingInputTokens(input), 0);
  return { object: "list", data, model: asked.model, usage: { prompt_tokens: tokens, total_tokens: tokens } };
}

/** The failure a `failWhen` trigger sets for this raw request body, if it matches. */
function failureFor(when: FakeUpstreamOptions["failWhen"], raw: string): InjectedFailure | undefined {
  return when && raw.includes(when.text) ? when.failure : undefined;
}

function bufferedBody(route: Route, id: string, created: number, model: string, output: FakeOutput): string {
  if (route === "chat") {
    return JSON.stringify({
      id,
      object: "chat.completion",
      created,
      model,
      choices: output.texts.map((content, index) => {
        const message: Record<string, string> = { role: "assistant", content };
        const reasoning = output.reasonings[index];
        if (reasoning !== undefined) message["reasoning_content"] = reasoning;
        return { index, message, logprobs: null, finish_reason: output.finishReason };
      }),
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

/**
 * Streams the answer as vLLM does: on chat a role chunk per choice first; then one chunk per
 * token, each carrying one choice, the choices interleaved (every choice's k-th token before
 * any choice's k+1-th, reasoning before content); a finish chunk per choice; with
 * include_usage a last chunk with empty choices and the totals; then [DONE].
 *
 * With continuous_usage_stats every chunk carries a usage object as vLLM fills it: the
 * tokens of that chunk's own choice so far and the prompt tokens of its prompt (on chat all
 * messages), not request totals; only the last chunk has the totals.
 *
 * Pacing (tokensPerSecond) is per generation step, all choices advancing together; an injected
 * cut counts token chunks across all choices.
 */
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
  startSse(res);
  if (s.ttftMs > 0) {
    await sleep(s.ttftMs, res);
    if (gone(res)) return;
  }

  const object = route === "chat" ? "chat.completion.chunk" : "text_completion";
  const head = `{"id":"${id}","object":"${object}","created":${created},"model":${JSON.stringify(req.model)},"choices":`;
  /** Prompt tokens of choice `index`'s prompt, as continuous usage reports them. */
  const promptOf = (index: number) => req.promptTokens[Math.floor(index / req.n)] ?? 0;
  const event = (index: number, choice: string, completionSoFar: number) => {
    let usage = "";
    if (req.continuousUsage) {
      const prompt = promptOf(index);
      usage = `,"usage":{"prompt_tokens":${prompt},"completion_tokens":${completionSoFar},"total_tokens":${prompt + completionSoFar}}`;
    }
    return `data: ${head}[${choice}]${usage}}\n\n`;
  };
  const chat = (index: number, delta: Record<string, string>, finish: string | null, soFar: number) =>
    event(
      index,
      `{"index":${index},"delta":${JSON.stringify(delta)},"logprobs":null,"finish_reason":${JSON.stringify(finish)}}`,
      soFar,
    );
  const text = (index: number, t: string, finish: string | null, soFar: number) =>
    event(
      index,
      `{"index":${index},"text":${JSON.stringify(t)},"logprobs":null,"finish_reason":${JSON.stringify(finish)}}`,
      soFar,
    );

  const choices = output.texts.length;
  let first = "";
  if (route === "chat") {
    for (let index = 0; index < choices; index++)
      first += chat(index, { role: "assistant", content: "" }, null, 0);
  }
  // Each choice's token chunks in order, reasoning first.
  const perChoice: string[][] = [];
  for (let index = 0; index < choices; index++) {
    const chunks: string[] = [];
    if (route === "chat") {
      for (const w of splitWords(output.reasonings[index])) {
        chunks.push(chat(index, { reasoning_content: w }, null, chunks.length + 1));
      }
      const content = output.texts[index] ?? "";
      for (const w of req.json === undefined ? splitWords(content) : jsonTokens(content)) {
        chunks.push(chat(index, { content: w }, null, chunks.length + 1));
      }
    } else {
      for (const w of splitWords(output.texts[index])) chunks.push(text(index, w, null, chunks.length + 1));
    }
    perChoice.push(chunks);
  }
  // Interleaved by generation step; `steps[i]` is the step of tokens[i].
  const tokens: string[] = [];
  const steps: number[] = [];
  const longest = Math.max(0, ...perChoice.map((c) => c.length));
  for (let step = 0; step < longest; step++) {
    for (const chunks of perChoice) {
      const chunk = chunks[step];
      if (chunk === undefined) continue;
      tokens.push(chunk);
      steps.push(step);
    }
  }
  const count = cutAfter === undefined ? tokens.length : Math.min(cutAfter, tokens.length);

  let tail = "";
  if (cutAfter === undefined) {
    for (let index = 0; index < choices; index++) {
      const soFar = perChoice[index]!.length;
      tail +=
        route === "chat"
          ? chat(index, {}, output.finishReason, soFar)
          : text(index, "", output.finishReason, soFar);
    }
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
      if (i > 0 && steps[i] !== steps[i - 1]) await sleep(s.tokenIntervalMs, res);
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
