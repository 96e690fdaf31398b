// The one set-up of the client files (packages/e2e/test/clients/*.e2e.test.ts): the all-in-one
// gateway in this process on a configuration with one account per way a request can end (served,
// refused for its budget, refused for a rate limit), a wire tap every client is given as its
// `fetch` so the books learn what each caller was told, and the refusals each client must raise
// as its own typed errors.
import type { FakeUpstream } from "@tollgate/testkit/fake-upstream";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, expect } from "vitest";
import { Books } from "../books.js";
import { type ConfiguredGateway, startConfiguredGateway } from "../gateways.js";

/** The chat model every key may use, and one that exists but no key used here may. */
export const MODEL = "m";
export const FORBIDDEN_MODEL = "other";
/** The embedding model of the served account. */
export const EMBED_MODEL = "e";

/** Output tokens the fake upstream produces when the cap allows more. */
export const UPSTREAM_OUTPUT_TOKENS = 40;
/** The served connection's output cap when a request carries none. */
export const DEFAULT_CAP = 64;

export const KEYS = {
  /** The served account: a large budget, no rate limit. */
  served: "tg_test_clients_served_0123456789abcdef",
  /** Another account's connection: the models and chat routes only. */
  chatOnly: "tg_test_clients_chatonly_0123456789abcd",
  /** A budget smaller than any quote at the connection's default output cap. */
  broke: "tg_test_clients_broke_0123456789abcdef0",
  /** A tokens-per-minute limit one default-cap request fills. */
  limited: "tg_test_clients_limited_0123456789abcde",
  /** A key the gateway does not know. */
  unknown: "tg_test_clients_unknown_0123456789abcde",
} as const;

const SERVED_BUDGET = 10n ** 9n;
// Pricing is 1 base unit per input token, 3 per output token. The broke connection's default
// cap of 1000 quotes above 3000, so anything sent without a cap is refused for its budget, while
// the books' probe (max_tokens 1, about 120 base units) still fits a dozen times.
const BROKE_BUDGET = 2000n;
const BROKE_CAP = 1000;
// A rate-limit window counts each request's input estimate plus its output cap: one request at
// the limited connection's default cap of 600 leaves under 400 of the 1000 tokens a minute, too
// few for another at that cap but room for the books' probes (about 25 tokens each).
const LIMITED_TOKENS_PER_MINUTE = 1000;
const LIMITED_CAP = 600;

const config = (upstreamUrl: string) => `
upstreams: [{ id: fake, baseUrl: "${upstreamUrl}" }]
models:
  - { id: ${MODEL}, upstream: fake, upstreamModel: fake-small, runtime: vllm, pricing: { inputPerMillion: 1000000, outputPerMillion: 3000000 } }
  - { id: ${FORBIDDEN_MODEL}, upstream: fake, upstreamModel: fake-large, runtime: vllm, pricing: { inputPerMillion: 1000000, outputPerMillion: 3000000 } }
  - { id: ${EMBED_MODEL}, upstream: fake, upstreamModel: fake-embed, runtime: vllm, kind: embedding, pricing: { inputPerMillion: 20000, outputPerMillion: 0 } }
accounts:
  - id: served
    connections:
      - id: served-conn
        models: [${MODEL}, ${EMBED_MODEL}]
        defaultModel: ${MODEL}
        policy: { defaultMaxOutputTokens: ${DEFAULT_CAP}, maxOutputTokens: 256 }
        budget: { amount: ${SERVED_BUDGET} }
        keys: [{ id: served-key, secret: ${KEYS.served} }]
  - id: chat-only
    connections:
      - id: chat-only-conn
        models: [${MODEL}]
        defaultModel: ${MODEL}
        routes: [models, chat]
        budget: { amount: ${SERVED_BUDGET} }
        keys: [{ id: chat-only-key, secret: ${KEYS.chatOnly} }]
  - id: broke
    connections:
      - id: broke-conn
        models: [${MODEL}]
        defaultModel: ${MODEL}
        policy: { defaultMaxOutputTokens: ${BROKE_CAP}, maxOutputTokens: 4096 }
        budget: { amount: ${BROKE_BUDGET} }
        keys: [{ id: broke-key, secret: ${KEYS.broke} }]
  - id: limited
    connections:
      - id: limited-conn
        models: [${MODEL}]
        defaultModel: ${MODEL}
        policy: { defaultMaxOutputTokens: ${LIMITED_CAP}, maxOutputTokens: 1000 }
        limits: { tokensPerMinute: ${LIMITED_TOKENS_PER_MINUTE} }
        budget: { amount: ${SERVED_BUDGET} }
        keys: [{ id: limited-key, secret: ${KEYS.limited} }]
`;

/** What one response through the tap told its caller. */
export interface Told {
  /** The route the client called, e.g. `/v1/responses`. */
  path: string;
  status: number;
  /** The cost the gateway told (the header, or a stream's `x_tollgate`); undefined when none. */
  cost?: bigint;
}

/**
 * A `fetch` for a client's own `fetch` option: it passes every request and response through
 * unchanged, and tells the books of the key's account what each successful answer said it cost
 * (`x-tollgate-cost` on a buffered answer, `x_tollgate.cost` in a stream's last events). The key
 * is read as the client sent it (`Authorization: Bearer` or Anthropic's `x-api-key`).
 */
export class Wire {
  readonly told: Told[] = [];
  readonly #books: ReadonlyMap<string, Books>;
  readonly #touched = new Set<Books>();

  constructor(books: ReadonlyMap<string, Books>) {
    this.#books = books;
  }

  /** The last answer's record (a stream's cost once its cost event was read). */
  last(): Told {
    const last = this.told.at(-1);
    if (!last) throw new Error("nothing went through the wire tap");
    return last;
  }

  /** The books of the accounts whose keys were used since the last call, and forgets them. */
  takeTouched(): Books[] {
    const touched = [...this.#touched];
    this.#touched.clear();
    return touched;
  }

  readonly fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const headers = new Headers(input instanceof Request ? input.headers : undefined);
    new Headers(init?.headers).forEach((value, name) => {
      headers.set(name, value);
    });
    const key = headers.get("x-api-key") ?? headers.get("authorization")?.replace(/^Bearer /, "") ?? "";
    const books = this.#books.get(key);
    if (books) this.#touched.add(books);
    const res = await fetch(input, init);
    const url = input instanceof Request ? input.url : input.toString();
    const record: Told = { path: new URL(url).pathname, status: res.status };
    if (!res.ok || !res.body) {
      this.told.push(record);
      return res;
    }
    const header = res.headers.get("x-tollgate-cost");
    if (header !== null || !res.headers.get("content-type")?.startsWith("text/event-stream")) {
      if (header !== null) {
        record.cost = BigInt(header);
        books?.tell(record.cost);
      }
      this.told.push(record);
      return res;
    }
    // A stream: its cost comes with its last events, told as soon as the caller has read them
    // (a client may stop reading once it has its final event).
    this.told.push(record);
    const decoder = new TextDecoder();
    let tail = "";
    const observed = res.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          controller.enqueue(chunk);
          if (record.cost !== undefined) return;
          tail = (tail + decoder.decode(chunk, { stream: true })).slice(-4096);
          const cost = /"x_tollgate":\{"cost":"(\d+)"/.exec(tail)?.[1];
          if (cost === undefined) return;
          record.cost = BigInt(cost);
          books?.tell(record.cost);
        },
      }),
    );
    const tapped = new Response(observed, {
      status: res.status,
      statusText: res.statusText,
      headers: res.headers,
    });
    Object.defineProperty(tapped, "url", { value: res.url });
    return tapped;
  };
}

/** The running gateway of one client file. */
export interface ClientGateway {
  /** The gateway's base URL (no `/v1`). */
  url: string;
  upstream: FakeUpstream;
  wire: Wire;
  /**
   * Call before a served stream that will be cut: `billed()`, once it was cut, reads what
   * metering billed it. A stream its caller left was told nothing: the books are told that
   * cost. A stream that failed mid-way told its cost on its error event (`told`, already in the
   * books through the wire tap): what metering billed it must be exactly that.
   */
  cutStream(): Promise<{ billed(): Promise<{ cost: bigint; told: boolean; outputTokens: number }> }>;
  /** Fills the limited connection's rate-limit window with one billed chat request (once a file). */
  fillRateLimit(): Promise<void>;
}

/**
 * Starts the gateway before a client file's tests and stops it after them; after each test,
 * checks the books of every account the test's clients used: what callers were told == what
 * metering recorded == what the budget lost, no hold left, no budget below zero.
 */
export function useClientGateway(): () => ClientGateway {
  let running: ConfiguredGateway | undefined;
  let current: ClientGateway | undefined;
  /** Each account's books, and its budget. */
  const budgets = new Map<Books, bigint>();

  beforeAll(async () => {
    running = await startConfiguredGateway(config, {
      upstream: { outputTokens: UPSTREAM_OUTPUT_TOKENS, record: true },
    });
    const gateway = running.gateway;
    const books = (id: string, key: string, budget: bigint) => {
      const kept = new Books(gateway, { id, key, budget });
      budgets.set(kept, budget);
      return kept;
    };
    const served = books("served", KEYS.served, SERVED_BUDGET);
    const chatOnly = books("chat-only", KEYS.chatOnly, SERVED_BUDGET);
    const broke = books("broke", KEYS.broke, BROKE_BUDGET);
    const limited = books("limited", KEYS.limited, SERVED_BUDGET);
    const wire = new Wire(
      new Map([
        [KEYS.served, served],
        [KEYS.chatOnly, chatOnly],
        [KEYS.broke, broke],
        [KEYS.limited, limited],
      ]),
    );
    let filled = false;
    current = {
      url: gateway.url,
      upstream: running.upstream,
      wire,
      async cutStream() {
        const before = await served.totals();
        return {
          async billed() {
            const told = wire.last().cost;
            const cost = told ?? (await served.billedUntold(before));
            const after = await served.totals();
            if (told !== undefined)
              expect(BigInt(after?.cost ?? "0") - BigInt(before?.cost ?? "0")).toBe(told);
            return {
              cost,
              told: told !== undefined,
              outputTokens: Number((after?.outputTokens ?? 0n) - (before?.outputTokens ?? 0n)),
            };
          },
        };
      },
      async fillRateLimit() {
        if (filled) return;
        const res = await wire.fetch(`${gateway.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${KEYS.limited}`, "content-type": "application/json" },
          body: JSON.stringify({ messages: [{ role: "user", content: "fill the window" }] }),
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        filled = true;
      },
    };
  });

  afterEach(async () => {
    running?.upstream.configure({ tokensPerSecond: 0 });
    for (const books of current?.wire.takeTouched() ?? []) {
      await books.check();
      expect(books.told).toBeLessThanOrEqual(budgets.get(books)!);
    }
  }, 60_000);

  afterAll(async () => {
    for (const books of budgets.keys()) books.close();
    await running?.stop();
  });

  return () => {
    if (!current) throw new Error("the client gateway is not running");
    return current;
  };
}

/** A refusal every client must raise as its own error: the key and model that provoke it. */
export interface Refusal {
  status: 401 | 402 | 403 | 429;
  code: string;
  key: string;
  model: string;
  /**
   * The output cap the refusal needs (the connection's default, which clients that send no cap
   * get), for a client that must send one.
   */
  cap: number;
}

/**
 * The refusals of the account door, as each client file provokes them (docs/account-door.md,
 * "Errors"): an unknown key, a budget the quote does not fit, a model outside the key's
 * connection, and a full rate-limit window (call `fillRateLimit()` first).
 */
export const REFUSALS = {
  badKey: { status: 401, code: "invalid_api_key", key: KEYS.unknown, model: MODEL, cap: DEFAULT_CAP },
  budget: { status: 402, code: "budget_exceeded", key: KEYS.broke, model: MODEL, cap: BROKE_CAP },
  model: {
    status: 403,
    code: "model_not_allowed",
    key: KEYS.served,
    model: FORBIDDEN_MODEL,
    cap: DEFAULT_CAP,
  },
  rateLimit: { status: 429, code: "rate_limited", key: KEYS.limited, model: MODEL, cap: LIMITED_CAP },
} as const satisfies Record<string, Refusal>;

/** A route the chat-only connection does not allow (its key on the Responses or embeddings routes). */
export const ROUTE_REFUSAL = {
  status: 403,
  code: "route_not_allowed",
  key: KEYS.chatOnly,
  model: MODEL,
  cap: DEFAULT_CAP,
} as const satisfies Refusal;

/** What a promise rejected with; fails the test when it resolved. */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => {
      throw new Error(`expected a refusal, got ${JSON.stringify(value)?.slice(0, 200)}`);
    },
    (err: unknown) => err,
  );
}

/**
 * What the openai SDK raises for `refusal`, as every client built on it hands it to its users
 * (the SDK itself, LangChain, the Agents SDK): its class for the status, with the status and the
 * gateway's code. The SDK has no class of its own for 402: that is its base APIError.
 */
export function expectOpenAIError(err: unknown, refusal: Refusal): InstanceType<typeof OpenAI.APIError> {
  const expected = {
    401: OpenAI.AuthenticationError,
    402: OpenAI.APIError,
    403: OpenAI.PermissionDeniedError,
    429: OpenAI.RateLimitError,
  }[refusal.status];
  expect(err).toBeInstanceOf(expected);
  const apiError = err as InstanceType<typeof OpenAI.APIError>;
  expect(apiError.status).toBe(refusal.status);
  expect(apiError.code).toBe(refusal.code);
  return apiError;
}
