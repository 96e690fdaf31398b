import { readFileSync } from "node:fs";
import { loadGatewayConfig, quoteOf } from "@tollgate/config";
import type { InternalAuth } from "@tollgate/kit/credentials";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { MeteringService, type UsageTotals } from "@tollgate/proto/metering";
import { expectedUsage, type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { uniqueNamespace, useNats, useRedis } from "@tollgate/testkit/fixtures";
import { DEMO_CONFIG, startStack } from "@tollgate/testkit/stack";
import OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { startConfiguredGateway } from "./gateways.js";

/**
 * No caller can get more work than was quoted and held (docs/money.md): fan-out fields are
 * priced, exactly one output cap reaches the upstream, a refused body costs nothing, holds
 * become exact costs as soon as an answer is complete, and a cut stream is billed the
 * upstream's own input count. The upstream behaves like vLLM (it honours `n`, answers a
 * choice per prompt, honours `max_tokens` when both cap fields are sent, counts usage
 * continuously when asked) and produces as much as it is allowed to, so an unpriced fan-out or
 * a smuggled cap shows up as money. Every scenario ends with the books checked: what callers
 * were told == budget spent == metering's analytics, no hold left, no budget below zero.
 */

const MODEL = "tollgate-mini";
const PRICES = loadGatewayConfig(DEMO_CONFIG).models.find((m) => m.id === MODEL)!.pricing;

/** A stream its caller cuts before its first token, and its quote. */
const CUT_EARLY = {
  model: MODEL,
  max_tokens: 4_000,
  stream: true,
  messages: [{ role: "user", content: "cut before the first token" }],
};
function cutEarlyQuote(): bigint {
  return quoteOf(Buffer.byteLength(JSON.stringify(CUT_EARLY)), 1, CUT_EARLY.max_tokens, PRICES);
}

/** One account per scenario, each with a budgeted connection of its own. */
const ACCOUNTS = {
  fanout: { budget: 20_000n },
  prompts: { budget: 10_000n },
  smuggle: { budget: 10n ** 12n },
  badbody: { budget: 5_000n, keyRequestsPerMinute: 3 },
  sequential: { budget: 1_500n },
  cut: { budget: 10n ** 12n },
  // Half of it never covers the quote of CUT_EARLY's stream: that stream is authorized alone,
  // with no lease (docs/money.md, "Leases", "The end of a budget").
  cutalone: { budget: (cutEarlyQuote() * 3n) / 2n },
} as const;
type AccountName = keyof typeof ACCOUNTS;

const keyOf = (name: AccountName) => `tg_test_money_${name}_0123456789abcdef`;

/** The demo configuration with one budgeted account per scenario appended. */
function withAccounts(yaml: string): string {
  const accounts = Object.entries(ACCOUNTS).map(([name, a]) => {
    const limits =
      "keyRequestsPerMinute" in a
        ? `\n        limits: { keyRequestsPerMinute: ${a.keyRequestsPerMinute} }`
        : "";
    return `
  - id: money-${name}
    connections:
      - id: ${name}-conn
        models: [${MODEL}]
        defaultModel: ${MODEL}
        policy: { defaultMaxOutputTokens: 256, maxOutputTokens: 4096 }
        budget: { amount: ${a.budget} }${limits}
        keys: [{ id: ${name}-key, secret: ${keyOf(name as AccountName)} }]`;
  });
  return `${yaml.trimEnd()}\n${accounts.join("\n")}\n`;
}

/** A running gateway the scenarios spend on. */
interface MoneyTarget {
  url: string;
  upstream: FakeUpstream;
  meteringAddr: string;
  /** api-edge's credentials, to read usage from metering as the admin API does. */
  meteringAuth: InternalAuth;
  /** Stops and restarts metering (multi-process stack only): holds must not wait for it. */
  pauseMetering?: () => Promise<void>;
  resumeMetering?: () => Promise<void>;
  stop(): Promise<void>;
}

/** The upstream produces up to 100,000 tokens per choice: only the cap it is sent bounds it. */
const UPSTREAM = { outputTokens: 100_000 };

async function allInOne(): Promise<MoneyTarget> {
  const demo = readFileSync(DEMO_CONFIG, "utf8");
  const running = await startConfiguredGateway(
    (url) => withAccounts(demo.replace("http://127.0.0.1:18000/v1", url)),
    { upstream: UPSTREAM },
  );
  return {
    url: running.gateway.url,
    upstream: running.upstream,
    meteringAddr: running.gateway.meteringAddr,
    meteringAuth: running.gateway.internalAuth("api-edge"),
    stop: running.stop,
  };
}

async function stack(): Promise<MoneyTarget> {
  const [nats, redis, upstream] = await Promise.all([useNats(), useRedis(), startFakeUpstream(UPSTREAM)]);
  const s = await startStack({
    natsUrl: nats.url,
    redisUrl: redis.url,
    namespace: uniqueNamespace("money"),
    routers: 2,
    upstreamPort: upstream.port,
    externalUpstream: true,
    transformConfig: withAccounts,
  });
  const metering = s.processes.find((p) => p.name === "metering")!;
  return {
    url: s.url,
    upstream,
    meteringAddr: `127.0.0.1:${metering.port}`,
    meteringAuth: s.internalAuth("api-edge"),
    pauseMetering: () => s.stopProcess("metering"),
    resumeMetering: () => s.startProcess("metering"),
    stop: async () => {
      await s.stop();
      await upstream.close();
      await nats.stop();
      await redis.stop();
    },
  };
}

/** What a caller saw of one request. */
interface Seen {
  status: number;
  /** x-tollgate-cost; 0n when absent. */
  cost: bigint;
  /** x-tollgate-budget-remaining; undefined when absent. */
  remaining: bigint | undefined;
  json: Record<string, unknown>;
}

function describeMoney(name: string, setup: () => Promise<MoneyTarget>) {
  describe(name, () => {
    let target: MoneyTarget;
    let metering: Client<MethodsOf<typeof MeteringService>>;
    /** What callers were told they spent, per account. */
    const told = new Map<AccountName, bigint>();
    const served = new Map<AccountName, number>();
    let current: AccountName | undefined;

    beforeAll(async () => {
      target = await setup();
      metering = createClient(MeteringService, target.meteringAddr, target.meteringAuth);
    }, 90_000);

    afterAll(async () => {
      metering?.$close();
      await target?.stop();
    });

    async function post(account: AccountName, path: string, body: unknown): Promise<Seen> {
      const res = await fetch(`${target.url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${keyOf(account)}`, "content-type": "application/json" },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });
      const cost = BigInt(res.headers.get("x-tollgate-cost") ?? "0");
      const left = res.headers.get("x-tollgate-budget-remaining");
      if (res.status === 200) {
        told.set(account, (told.get(account) ?? 0n) + cost);
        served.set(account, (served.get(account) ?? 0) + 1);
      }
      return {
        status: res.status,
        cost,
        remaining: left === null ? undefined : BigInt(left),
        json: (await res.json()) as Record<string, unknown>,
      };
    }

    /** A chat through the official openai SDK, as a user's code sends it. */
    async function sdkChat(
      account: AccountName,
      params: OpenAI.ChatCompletionCreateParamsNonStreaming,
    ): Promise<Seen> {
      const client = new OpenAI({ baseURL: `${target.url}/v1`, apiKey: keyOf(account), maxRetries: 0 });
      try {
        const { data, response } = await client.chat.completions.create(params).withResponse();
        const cost = BigInt(response.headers.get("x-tollgate-cost") ?? "0");
        told.set(account, (told.get(account) ?? 0n) + cost);
        served.set(account, (served.get(account) ?? 0) + 1);
        const left = response.headers.get("x-tollgate-budget-remaining");
        return {
          status: response.status,
          cost,
          remaining: left === null ? undefined : BigInt(left),
          json: data as unknown as Record<string, unknown>,
        };
      } catch (err) {
        if (!(err instanceof OpenAI.APIError)) throw err;
        return {
          status: err.status ?? 0,
          cost: 0n,
          remaining: undefined,
          json: { error: { code: err.code } },
        };
      }
    }

    const chat = (account: AccountName, body: Record<string, unknown>) =>
      post(account, "/v1/chat/completions", {
        model: MODEL,
        messages: [{ role: "user", content: "hi" }],
        ...body,
      });

    async function meteringTotals(account: AccountName, requests: number): Promise<UsageTotals | undefined> {
      let totals: UsageTotals | undefined;
      const deadline = Date.now() + 20_000;
      do {
        // A metering that was just restarted may not answer at once.
        totals = await metering.getUsage({ accountId: `money-${account}` }).then(
          (r) => r.totals,
          () => totals,
        );
        if (Number(totals?.requests ?? 0n) >= requests) break;
        await new Promise((r) => setTimeout(r, 100));
      } while (Date.now() < deadline);
      return totals;
    }

    /**
     * The books of the scenario's account: metering applied every served request at the cost
     * its caller was told, and a probe request's budget-remaining shows the budget less exactly
     * what callers were told and the probe's own cost: no hold left, nothing spent untold.
     */
    afterEach(async () => {
      const account = current;
      current = undefined;
      if (!account) return;
      const budget = ACCOUNTS[account].budget;
      const check = async () => {
        const totals = await meteringTotals(account, served.get(account) ?? 0);
        expect(Number(totals?.requests ?? 0n)).toBe(served.get(account) ?? 0);
        expect(BigInt(totals?.cost ?? "0")).toBe(told.get(account) ?? 0n);
        expect(told.get(account) ?? 0n).toBeLessThanOrEqual(budget);
      };
      await check();
      // Metering has applied everything; its settlements land right after it records.
      await new Promise((r) => setTimeout(r, 200));
      const spentBefore = told.get(account) ?? 0n;
      const probe = await chat(account, { max_tokens: 1 });
      if (probe.status === 200) {
        expect(probe.remaining).toBe(budget - spentBefore - probe.cost);
      } else {
        // Too little left for even the probe: what is left is below its quote, and never negative.
        expect(probe.status).toBe(402);
        expect(budget - spentBefore).toBeGreaterThanOrEqual(0n);
      }
      await check();
    }, 60_000);

    it("prices n choices into the quote: the budget is never overspent, remaining never negative", async () => {
      current = "fanout";
      const statuses: number[] = [];
      for (let i = 0; i < 4; i++) {
        const seen = await sdkChat("fanout", {
          model: MODEL,
          n: 16,
          max_tokens: 1_000,
          messages: [{ role: "user", content: "hi" }],
        });
        statuses.push(seen.status);
        if (seen.remaining !== undefined) expect(seen.remaining).toBeGreaterThanOrEqual(0n);
        if (seen.status === 200) {
          // Every choice came back, each bounded by the cap, and was paid for.
          const usage = seen.json.usage as { completion_tokens: number };
          expect((seen.json.choices as unknown[]).length).toBe(16);
          expect(usage.completion_tokens).toBe(16_000);
        } else {
          expect(seen.status).toBe(402);
          expect((seen.json.error as { code: string }).code).toBe("budget_exceeded");
        }
      }
      // 16 × 1,000 output tokens cost 9,600 of the 20,000: two fit, the third is refused.
      expect(statuses).toEqual([200, 200, 402, 402]);
    });

    it("refuses n beyond what a quote may price, and beam search, with a clear 400", async () => {
      current = "fanout";
      for (const body of [{ n: 129 }, { n: 0 }, { best_of: 21 }, { use_beam_search: true }]) {
        const seen = await chat("fanout", { max_tokens: 5, ...body });
        expect(seen.status).toBe(400);
        expect((seen.json.error as { code: string }).code).toBe("invalid_request");
      }
    });

    it("prices a prompt list on /v1/completions: one output per prompt, within the budget", async () => {
      current = "prompts";
      const prompt = Array.from({ length: 100 }, (_, i) => `prompt ${i}`);
      const first = await post("prompts", "/v1/completions", { model: MODEL, prompt, max_tokens: 100 });
      expect(first.status).toBe(200);
      expect((first.json.choices as unknown[]).length).toBe(100);
      expect((first.json.usage as { completion_tokens: number }).completion_tokens).toBe(10_000);
      // 10,000 output tokens cost 6,000: a second list does not fit what is left of 10,000.
      const second = await post("prompts", "/v1/completions", { model: MODEL, prompt, max_tokens: 100 });
      expect(second.status).toBe(402);
      expect(first.remaining).toBeGreaterThanOrEqual(0n);
    });

    it("forwards one output cap, the smallest the caller sent: no alias smuggles a larger one", async () => {
      current = "smuggle";
      const seen = await chat("smuggle", { max_tokens: 1_000_000, max_completion_tokens: 1 });
      expect(seen.status).toBe(200);
      expect((seen.json.usage as { completion_tokens: number }).completion_tokens).toBe(1);
      const other = await chat("smuggle", { max_completion_tokens: 3_000, max_tokens: 2 });
      expect((other.json.usage as { completion_tokens: number }).completion_tokens).toBe(2);
      // Above the policy in any alias is still refused.
      expect((await chat("smuggle", { max_tokens: 5_000 })).status).toBe(403);
    });

    it("holds nothing and counts no rate-limit unit for a body it refuses", async () => {
      current = "badbody";
      const bad = [
        { model: MODEL, messages: "not a list" },
        { model: MODEL, messages: [] },
        { model: MODEL, messages: [{ role: "user", content: "x" }], max_tokens: -1 },
        { model: MODEL, messages: [{ role: "user", content: "x" }], n: 1_000 },
      ];
      for (let i = 0; i < 8; i++) {
        const seen = await post("badbody", "/v1/chat/completions", bad[i % bad.length]);
        expect(seen.status).toBe(400);
      }
      expect((await post("badbody", "/v1/chat/completions", "{not json")).status).toBe(400);
      // The key's 3 requests a minute are all there, minus the one the books' probe takes.
      for (let i = 0; i < 2; i++) expect((await chat("badbody", { max_tokens: 5 })).status).toBe(200);
      // A bad key still gets its 401 before the body's 400.
      const res = await fetch(`${target.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: "Bearer tg_nope_0000000000000000", "content-type": "application/json" },
        body: JSON.stringify(bad[0]),
      });
      expect(res.status).toBe(401);
    });

    it("refuses a caller sending one request at a time only when what is left is below its quote", async () => {
      current = "sequential";
      // Holds become exact costs when each answer is complete, even with metering away.
      await target.pauseMetering?.();
      try {
        const body = { model: MODEL, max_tokens: 100, messages: [{ role: "user", content: "hi" }] };
        const quote = quoteOf(Buffer.byteLength(JSON.stringify(body)), 1, 100, PRICES);
        let refused: Seen | undefined;
        for (let i = 0; i < 60 && !refused; i++) {
          const seen = await post("sequential", "/v1/chat/completions", body);
          if (seen.status !== 200) refused = seen;
        }
        expect(refused?.status).toBe(402);
        const left = ACCOUNTS.sequential.budget - (told.get("sequential") ?? 0n);
        expect(left).toBeGreaterThanOrEqual(0n);
        expect(left).toBeLessThan(quote);
      } finally {
        await target.resumeMetering?.();
      }
    });

    it("bills a stream cut by its caller with the upstream's own count of its input", async () => {
      current = "cut";
      target.upstream.configure({ tokensPerSecond: 20 });
      try {
        const body = {
          model: MODEL,
          max_tokens: 200,
          stream: true,
          messages: [{ role: "user", content: "Count the eight tokens of this prompt please" }],
        };
        const controller = new AbortController();
        const res = await fetch(`${target.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${keyOf("cut")}`, "content-type": "application/json" },
          body: JSON.stringify(body),
          signal: controller.signal,
        });
        expect(res.status).toBe(200);
        const reader = res.body!.getReader();
        let text = "";
        while ((text.match(/"content":"[^"]+"/g) ?? []).length < 2) {
          const { value, done } = await reader.read();
          if (done) break;
          text += new TextDecoder().decode(value);
        }
        controller.abort();
        await reader.cancel().catch(() => {});
        const totals = await meteringTotals("cut", 1);
        const upstreamCount = expectedUsage({ ...body, model: "fake-small" }).prompt_tokens;
        expect(Number(totals?.inputTokens)).toBe(upstreamCount);
        expect(Number(totals?.outputTokens)).toBeGreaterThanOrEqual(2);
        expect(Number(totals?.outputTokens)).toBeLessThan(200);
        // The cut stream is the caller's spend too (the books below count it).
        told.set("cut", (told.get("cut") ?? 0n) + BigInt(totals?.cost ?? "0"));
        served.set("cut", (served.get("cut") ?? 0) + 1);
      } finally {
        target.upstream.configure({ tokensPerSecond: 0 });
      }
    });

    /**
     * A stream whose caller goes while the upstream has its request but has sent no token yet:
     * nothing was produced, so it is billed 0 (told 0), and its hold goes once metering applied
     * the router's event for it; it waits out no reservation TTL (docs/money.md, "Holds").
     */
    async function cutBeforeFirstToken(account: "cut" | "cutalone"): Promise<void> {
      current = account;
      target.upstream.configure({ ttftMs: 60_000, record: true });
      try {
        const controller = new AbortController();
        const answer = fetch(`${target.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${keyOf(account)}`, "content-type": "application/json" },
          body: JSON.stringify(CUT_EARLY),
          signal: controller.signal,
        }).catch(() => undefined);
        // The upstream has the request (the router runs the stream); its first token is a minute away.
        const deadline = Date.now() + 10_000;
        while (
          !target.upstream.requests.some((r) => JSON.stringify(r.body).includes("cut before the first"))
        ) {
          expect(Date.now()).toBeLessThan(deadline);
          await new Promise((r) => setTimeout(r, 20));
        }
        controller.abort();
        expect(await answer).toBeUndefined();
        // Billed nothing, and metered as such: one request at 0 (the books after the test).
        served.set(account, (served.get(account) ?? 0) + 1);
        const totals = await meteringTotals(account, served.get(account)!);
        expect(BigInt(totals?.cost ?? "-1")).toBe(told.get(account) ?? 0n);
      } finally {
        target.upstream.configure({ ttftMs: 0, record: false });
      }
      // Metering applied its event: nothing of its quote is held any more.
      await new Promise((r) => setTimeout(r, 200));
      const spent = told.get(account) ?? 0n;
      const probe = await chat(account, { max_tokens: 1 });
      expect(probe.status).toBe(200);
      expect(probe.remaining).toBe(ACCOUNTS[account].budget - spent - probe.cost);
    }

    it("holds nothing for a stream its caller cut before its first token (on a lease), billed 0", async () => {
      await cutBeforeFirstToken("cut");
    });

    it("holds nothing for a stream its caller cut before its first token (authorized alone), billed 0", async () => {
      await cutBeforeFirstToken("cutalone");
    });
  });
}

describeMoney("money no caller can bend: all-in-one, in process", allInOne);
describeMoney("money no caller can bend: multi-process stack on NATS and Redis", stack);
