// Account-door traffic for the fault tests (faults.e2e, cluster.e2e): chat requests as a caller
// sends them, what each came to as the caller saw it, load until a fault is over, and the books
// (metering's analytics, the budget's spent and held in Redis) to compare them with.
import { request } from "node:http";
import { isRedisUnavailable, type Redis, scanStream } from "@tollgate/kit/redis";
import { expect } from "vitest";

/** What one request came to, as its caller saw it. */
export interface Outcome {
  status: number;
  /** When it was sent, ms since the fault's start (negative: before it). */
  at: number;
  ms: number;
  streamed: boolean;
  /**
   * Cost the caller was told (header, or a stream's usage chunk, or the error event of a stream
   * cut short and billed); 0n when none.
   */
  cost: bigint;
  /** A stream's `x-tollgate-cost` trailer, when it had one. */
  trailerCost?: bigint;
  /** Content chunks relayed to the caller (streams), or completion tokens (buffered). */
  tokens: number;
  /** A stream ended with `data: [DONE]`. */
  done: boolean;
  /** The error body's code (a JSON error, or a stream's final error event). */
  errorCode?: string;
  errorType?: string;
  retryAfter?: string | null;
  requestIdInBody?: boolean;
  /** The end of the body, for failure messages. */
  tail: string;
}

export interface ChatOptions {
  stream: boolean;
  maxTokens: number;
  idempotencyKey?: string;
  /** The fault's start (ms since the epoch), for `Outcome.at`; now when not given. */
  t0?: () => number;
  /** How long the answer may take before the request counts as unanswered. Default 15 s. */
  timeoutMs?: number;
}

/** One `tollgate-mini` chat completion through `url` with key `key`, buffered or streamed. */
export async function sendChat(url: string, key: string, i: number, opts: ChatOptions): Promise<Outcome> {
  const started = performance.now();
  const at = Date.now() - (opts.t0?.() ?? Date.now());
  const headers: Record<string, string> = {
    authorization: `Bearer ${key}`,
    "content-type": "application/json",
  };
  if (opts.idempotencyKey) headers["idempotency-key"] = opts.idempotencyKey;
  let res: Answer;
  try {
    res = await post(
      `${url}/v1/chat/completions`,
      headers,
      JSON.stringify({
        model: "tollgate-mini",
        max_tokens: opts.maxTokens,
        stream: opts.stream,
        ...(opts.stream ? { stream_options: { include_usage: true } } : {}),
        messages: [{ role: "user", content: `traffic ${i}` }],
      }),
      opts.timeoutMs ?? 15_000,
    );
  } catch (err) {
    throw new Error(`request ${i} got no answer: ${(err as Error).message}`);
  }
  const text = res.text;
  const out: Outcome = {
    status: res.status,
    at,
    ms: performance.now() - started,
    streamed: opts.stream,
    cost: 0n,
    tokens: 0,
    done: false,
    retryAfter: res.headers.get("retry-after"),
    tail: text.slice(-400),
  };
  const readError = (json: { error?: { code?: string; type?: string; request_id?: string } }) => {
    out.errorCode = json.error?.code;
    out.errorType = json.error?.type;
    out.requestIdInBody = json.error?.request_id === res.headers.get("x-request-id");
  };
  if (res.status !== 200 || !opts.stream) {
    const json = JSON.parse(text);
    if (res.status !== 200) readError(json);
    else {
      out.cost = BigInt(res.headers.get("x-tollgate-cost") ?? "0");
      out.tokens = json.usage.completion_tokens;
    }
    return out;
  }
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ")) continue;
    const data = line.slice(6);
    if (data === "[DONE]") {
      out.done = true;
      continue;
    }
    const json = JSON.parse(data);
    if (json.error) {
      readError(json);
      // A stream cut short and billed all the same tells its cost on its error event.
      if (json.x_tollgate) out.cost = BigInt(json.x_tollgate.cost);
    } else if (json.choices?.length === 0 && json.usage) out.cost = BigInt(json.x_tollgate?.cost ?? "0");
    else if (json.choices?.[0]?.delta?.content) out.tokens++;
  }
  const trailer = res.trailers["x-tollgate-cost"];
  if (trailer !== undefined) out.trailerCost = BigInt(trailer);
  return out;
}

/** An HTTP answer read whole: its status, headers, body and trailers (a stream's cost). */
interface Answer {
  status: number;
  headers: { get(name: string): string | null };
  text: string;
  trailers: NodeJS.Dict<string>;
}

/** POSTs `body` with node:http (fetch does not expose HTTP trailers). */
function post(
  url: string,
  headers: Record<string, string>,
  body: string,
  timeoutMs: number,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: "POST", headers, signal: AbortSignal.timeout(timeoutMs) }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => {
        text += c;
      });
      res.on("error", reject);
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: {
            get: (name) => {
              const v = res.headers[name.toLowerCase()];
              return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
            },
          },
          text,
          trailers: res.trailers,
        }),
      );
    });
    req.on("error", reject);
    req.end(body);
  });
}

/** `clients` concurrent callers sending requests one after another until `stop` resolves. */
export async function load(
  clients: number,
  stop: Promise<void>,
  request: (n: number) => Promise<Outcome>,
): Promise<Outcome[]> {
  let stopped = false;
  void stop.then(() => {
    stopped = true;
  });
  let n = 0;
  const outcomes: Outcome[] = [];
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (!stopped) outcomes.push(await request(n++));
    }),
  );
  return outcomes;
}

/** The spec's 5xx error body: a retryable 503 with the request id, answered fast. */
export function isFastRetryable503(o: Outcome): boolean {
  return o.status === 503 && o.errorType === "server_error" && o.requestIdInBody === true && o.ms < 1_000;
}

/** Outcomes by status, error and speed, for the test output and failure messages. */
export function summary(outcomes: Outcome[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const o of outcomes) {
    const speed = o.ms < 1_000 ? "<1s" : o.ms < 5_000 ? "1-5s" : ">5s";
    const k = o.status === 200 ? `200 ${speed}` : `${o.status} ${o.errorType}/${o.errorCode} ${speed}`;
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

export interface Books {
  requests: number;
  outputTokens: number;
  cost: bigint;
  spent: bigint;
  held: bigint;
}

/** Where the books are read: the admin API (metering's analytics) and auth-policy's Redis. */
export interface Ledgers {
  adminUrl: string;
  adminToken: string;
  /** A connection of the test's own to the stack's Redis (one server or a cluster). */
  peek: Redis;
  /** The stack's REDIS_PREFIX. */
  prefix: string;
}

/** A read of the test's own connection, retried while its view of a cluster catches up with a failover. */
export async function retryRead<T>(command: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      return await command();
    } catch (err) {
      if (!isRedisUnavailable(err) || Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** Metering's analytics, and the budget's spent and held read from every master. */
export async function books(at: Ledgers, accountId: string): Promise<Books> {
  const res = await fetch(`${at.adminUrl}/admin/v1/usage?account=${accountId}`, {
    headers: { authorization: `Bearer ${at.adminToken}` },
  });
  expect(res.status).toBe(200);
  const { totals } = (await res.json()) as {
    totals: { requests: number; output_tokens: number; cost: string };
  };
  let spent = 0n;
  let held = 0n;
  const keys: string[] = [];
  for await (const batch of scanStream(at.peek, {
    match: `${at.prefix}auth:budget:{${accountId}}:connection:*`,
  }))
    keys.push(...batch);
  for (const key of keys.filter((k) => !k.endsWith(":holds"))) {
    const [s, h] = await retryRead(() => at.peek.hmget(key, "spent", "held"));
    spent += BigInt(s ?? "0");
    held += BigInt(h ?? "0");
  }
  return {
    requests: Number(totals.requests),
    outputTokens: Number(totals.output_tokens),
    cost: BigInt(totals.cost),
    spent,
    held,
  };
}

/**
 * Waits until the books show `requests` applied and no hold left (or `timeoutMs` passed), then
 * returns them with how long that took.
 */
export async function settledBooks(
  at: Ledgers,
  accountId: string,
  requests: number,
  timeoutMs = 25_000,
): Promise<Books & { waitedMs: number }> {
  const started = Date.now();
  for (;;) {
    const b = await books(at, accountId).catch(() => undefined);
    const late = Date.now() - started > timeoutMs;
    if (b && ((b.requests >= requests && b.held === 0n) || late))
      return { ...b, waitedMs: Date.now() - started };
    if (!b && late) return { ...(await books(at, accountId)), waitedMs: Date.now() - started };
    await new Promise((r) => setTimeout(r, 250));
  }
}
