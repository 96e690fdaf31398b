import { jetstream } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { natsNames } from "@tollgate/proto/subjects";
import { type UsageRecorded, usageEventsOf } from "@tollgate/proto/usage";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse, stringify } from "yaml";
import { adminCreate } from "./gateways.js";

const MODEL = "tollgate-mini";
/** Served by the "shared" upstream alone, which answers 500 to any prompt containing POISON. */
const SOLO = "tollgate-solo";
const POISON = "poison-pill-9e2d";
const FAILURES = 3;
const BUDGET = 50_000_000n;
const MAX_TOKENS = 4;

/**
 * Upstream failover across two inference-router processes: a model served by two upstreams, the
 * preferred one answering 500 to everything. Every caller gets an answer billed once to the
 * upstream that served it, and the failing upstream is cooled down on both routers after a
 * bounded number of attempts (and one failed probe), not one per request. An upstream that
 * answers 500 only to one caller's prompts is never cooled down for the others.
 */
describe("failover between upstreams on the multi-process stack (two routers)", () => {
  const namespace = uniqueNamespace("failover");
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  let good: FakeUpstream;
  let bad: FakeUpstream;
  let shared: FakeUpstream;
  let client: OpenAI;
  let otherTenant: OpenAI;
  let secret: string;

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    good = await startFakeUpstream({ record: true });
    bad = await startFakeUpstream({ failure: { status: 500 }, record: true });
    shared = await startFakeUpstream({ failWhen: { text: POISON, failure: { status: 500 } }, record: true });
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 2,
      transformConfig: (yaml) => {
        const doc = parse(yaml) as {
          upstreams: Array<Record<string, unknown>>;
          models: Array<Record<string, unknown>>;
          resilience?: unknown;
        };
        doc.upstreams.push(
          { id: "bad", baseUrl: bad.url },
          { id: "good", baseUrl: good.url },
          { id: "shared", baseUrl: shared.url },
        );
        const mini = doc.models.find((m) => m.id === MODEL)!;
        doc.models.push({ ...mini, id: SOLO, upstream: "shared" });
        delete mini.upstream;
        // "bad" is preferred: every router tries it first until it is cooled down.
        mini.upstreams = [
          { id: "bad", priority: 0 },
          { id: "good", priority: 1 },
        ];
        doc.resilience = {
          retry: { maxAttempts: 3, baseBackoffMs: 10, maxBackoffMs: 50 },
          cooldown: { failures: FAILURES, windowMs: 60_000, durationMs: 300_000 },
        };
        return stringify(doc);
      },
    });
    await admin("/admin/v1/accounts", { id: "fo" });
    await admin("/admin/v1/accounts/fo/connections", {
      id: "fo-conn",
      models: [MODEL, SOLO],
      budget: { amount: BUDGET.toString() },
    });
    ({ secret } = (await admin("/admin/v1/accounts/fo/connections/fo-conn/keys", {})) as { secret: string });
    // No SDK retries: a request that failed must show as failed.
    client = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: secret, maxRetries: 0 });
    await admin("/admin/v1/accounts", { id: "fo-other" });
    await admin("/admin/v1/accounts/fo-other/connections", {
      id: "fo-other-conn",
      models: [SOLO],
      budget: { amount: BUDGET.toString() },
    });
    const other = (await admin("/admin/v1/accounts/fo-other/connections/fo-other-conn/keys", {})) as {
      secret: string;
    };
    otherTenant = new OpenAI({ baseURL: `${stack.url}/v1`, apiKey: other.secret, maxRetries: 0 });
  }, 60_000);

  afterAll(async () => {
    await stack?.stop();
    await good?.close();
    await bad?.close();
    await shared?.close();
    await nats?.stop();
    await redis?.stop();
  });

  const admin = (path: string, body: unknown) => adminCreate(stack, path, body);

  /** One request through the official SDK; its cost from the header or the usage chunk. */
  async function request(i: number): Promise<{ cost: bigint; text: string }> {
    const messages = [{ role: "user" as const, content: `failover ${i}` }];
    if (i % 4 === 3) {
      const stream = await client.chat.completions.create({
        model: MODEL,
        max_tokens: MAX_TOKENS,
        messages,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = "";
      let cost: bigint | undefined;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        const money = (chunk as { x_tollgate?: { cost: string } }).x_tollgate;
        if (money) cost = BigInt(money.cost);
      }
      if (cost === undefined) throw new Error("the stream carried no cost");
      return { cost, text };
    }
    const { data, response } = await client.chat.completions
      .create({ model: MODEL, max_tokens: MAX_TOKENS, messages })
      .withResponse();
    return {
      cost: BigInt(response.headers.get("x-tollgate-cost") ?? "-1"),
      text: data.choices[0]?.message.content ?? "",
    };
  }

  /** Every value of `metric` with `labels` on one router's /metrics, summed. */
  async function metric(router: string, name: string, labels: Record<string, string>): Promise<number> {
    const text = await (await fetch(stack.metricsUrls[router]!)).text();
    let sum = 0;
    for (const m of text.matchAll(new RegExp(`^${name}\\{([^}]*)\\} (\\S+)$`, "gm"))) {
      const have = Object.fromEntries([...m[1]!.matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
      if (Object.entries(labels).every(([k, v]) => have[k] === v)) sum += Number(m[2]);
    }
    return sum;
  }
  const routers = ["inference-router-1", "inference-router-2"];
  const onBoth = async (name: string, labels: Record<string, string>) =>
    Promise.all(routers.map((r) => metric(r, name, labels)));

  async function usageTotals(): Promise<{ requests: number; cost: string; output_tokens: number }> {
    const res = await fetch(`${stack.adminUrls[0]}/admin/v1/usage?account=fo`, {
      headers: { authorization: `Bearer ${stack.adminToken}` },
    });
    return ((await res.json()) as { totals: { requests: number; cost: string; output_tokens: number } })
      .totals;
  }

  async function budgetRemaining(): Promise<string> {
    const res = await fetch(`${stack.url}/v1/models`, { headers: { authorization: `Bearer ${secret}` } });
    return res.headers.get("x-tollgate-budget-remaining") ?? "";
  }

  /** Waits until metering counted `requests` and the budget shows exactly their cost spent. */
  async function settled(requests: number) {
    let totals = await usageTotals();
    let remaining = "";
    for (let i = 0; i < 150; i++) {
      totals = await usageTotals();
      remaining = await budgetRemaining();
      if (Number(totals.requests) === requests && remaining === (BUDGET - BigInt(totals.cost)).toString())
        break;
      await new Promise((r) => setTimeout(r, 100));
    }
    return { totals, remaining };
  }

  /** The usage events this run stored on JetStream. */
  async function usageEvents(): Promise<UsageRecorded[]> {
    const nc = await connect({ servers: nats.url });
    try {
      const consumer = await jetstream(nc).consumers.get(natsNames(namespace).usageStream);
      const events: UsageRecorded[] = [];
      for await (const m of await consumer.fetch({ max_messages: 1000, expires: 1_500 })) {
        events.push(...usageEventsOf(m.subject, m.data));
        if (m.info.pending === 0) break;
      }
      return events.filter((e) => e.accountId === "fo");
    } finally {
      await nc.close();
    }
  }

  const served: Array<{ cost: bigint; text: string }> = [];

  it("answers a burst of 30 buffered and streamed requests, each billed once, and cools the failing upstream down on both routers", async () => {
    // First one at a time, so one router reaches the threshold while the other is still below
    // it: the other can only learn of the cooldown from the broadcast.
    for (let i = 0; i < 8; i++) served.push(await request(i));
    // Then concurrently, four at a time.
    let next = 8;
    const worker = async () => {
      while (next < 30) served.push(await request(next++));
    };
    await Promise.all(Array.from({ length: 4 }, worker));

    expect(served).toHaveLength(30);
    for (const r of served) {
      expect(r.text.length).toBeGreaterThan(0);
      expect(r.cost).toBeGreaterThan(0n);
    }
    expect(good.requests.filter((r) => r.method === "POST")).toHaveLength(30);

    // Cooled down on both routers, after a bounded number of failed attempts.
    expect(await onBoth("tollgate_upstream_cooldown", { upstream: "bad" })).toEqual([1, 1]);
    expect(await onBoth("tollgate_upstream_cooldown", { upstream: "good" })).toEqual([0, 0]);
    const failed = await onBoth("tollgate_upstream_attempts_total", {
      upstream: "bad",
      outcome: "status_5xx",
    });
    const failedTotal = failed[0]! + failed[1]!;
    expect(failedTotal).toBeGreaterThan(0);
    // At most FAILURES on the router that decided, and fewer on the one that heard of it.
    expect(failedTotal).toBeLessThanOrEqual(2 * FAILURES - 1);
    // The deciding router probed it once before cooling it down, and the probe failed too.
    const probes = await onBoth("tollgate_upstream_cooldown_probe_total", { upstream: "bad" });
    expect(probes[0]! + probes[1]!).toBe(1);
    const failedProbes = await onBoth("tollgate_upstream_cooldown_probe_total", {
      upstream: "bad",
      result: "failed",
    });
    expect(failedProbes[0]! + failedProbes[1]!).toBe(1);
    expect(failedTotal + 1).toBe(bad.requests.length);
    const started = await onBoth("tollgate_upstream_cooldowns_total", { upstream: "bad" });
    expect(started[0]! + started[1]!).toBe(1);
    const fallbacks = await onBoth("tollgate_upstream_fallbacks_total", { from: "bad", to: "good" });
    expect(fallbacks[0]! + fallbacks[1]!).toBe(failedTotal);
    expect(await onBoth("tollgate_upstream_attempts_total", { upstream: "good", outcome: "ok" })).toSatisfy(
      (ok: number[]) => ok[0]! + ok[1]! === 30,
    );

    // Billed once each, for what "good" served; the failed attempts cost nothing.
    const servedCost = served.reduce((sum, r) => sum + r.cost, 0n);
    const { totals, remaining } = await settled(30);
    expect(Number(totals.requests)).toBe(30);
    expect(totals.cost).toBe(servedCost.toString());
    expect(Number(totals.output_tokens)).toBe(30 * MAX_TOKENS);
    expect(remaining).toBe((BUDGET - servedCost).toString());
    const events = await usageEvents();
    expect(events).toHaveLength(30);
    expect(new Set(events.map((e) => e.upstreamId))).toEqual(new Set(["good"]));
  }, 60_000);

  it("does not retry a stream whose upstream dies after its first chunk, and bills what it produced once", async () => {
    const before = { good: good.requests.length, bad: bad.requests.length, totals: await usageTotals() };
    good.failNext(1, { afterChunks: 2 });
    const stream = await client.chat.completions.create({
      model: MODEL,
      max_tokens: 8,
      messages: [{ role: "user", content: "cut me off" }],
      stream: true,
    });
    let chunks = 0;
    const err = await (async () => {
      for await (const _ of stream) chunks++;
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect(chunks).toBeGreaterThanOrEqual(1);
    // One attempt, on the upstream that died: no second answer after the first chunk.
    expect(good.requests.length - before.good).toBe(1);
    expect(bad.requests.length).toBe(before.bad);
    const written = good.requests.at(-1)!.tokensWritten ?? 0;
    expect(written).toBe(2);

    const { totals, remaining } = await settled(Number(before.totals.requests) + 1);
    expect(Number(totals.requests)).toBe(Number(before.totals.requests) + 1);
    expect(Number(totals.output_tokens) - Number(before.totals.output_tokens)).toBe(written);
    expect(BigInt(totals.cost)).toBeGreaterThan(BigInt(before.totals.cost));
    expect(remaining).toBe((BUDGET - BigInt(totals.cost)).toString());
    const cut = (await usageEvents()).filter((e) => e.outputTokens === written && e.upstreamId === "good");
    expect(cut).toHaveLength(1);
  }, 30_000);

  it("does not let one caller's prompts that make an upstream answer 500 take it away from another tenant", async () => {
    for (let i = 0; i < 3; i++) {
      const err = await client.chat.completions
        .create({
          model: SOLO,
          max_tokens: MAX_TOKENS,
          messages: [{ role: "user", content: `${POISON} ${i}` }],
        })
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    }
    const poisoned = shared.requests.filter((r) => JSON.stringify(r.body).includes(POISON)).length;

    // Another tenant right after: served by the same upstream, not 502 with Retry-After.
    const { data, response } = await otherTenant.chat.completions
      .create({
        model: SOLO,
        max_tokens: MAX_TOKENS,
        messages: [{ role: "user", content: "an ordinary question" }],
      })
      .withResponse();
    expect(response.status).toBe(200);
    expect(data.choices[0]?.message.content?.length).toBeGreaterThan(0);
    expect(shared.requests.at(-1)!.body).toMatchObject({
      messages: [{ role: "user", content: "an ordinary question" }],
    });

    // Each poisonous request reached the threshold by itself (three attempts, each answered 500).
    expect(poisoned).toBe(9);
    expect(await onBoth("tollgate_upstream_cooldown", { upstream: "shared" })).toEqual([0, 0]);
    const started = await onBoth("tollgate_upstream_cooldowns_total", { upstream: "shared" });
    expect(started[0]! + started[1]!).toBe(0);
    const ok = await onBoth("tollgate_upstream_cooldown_probe_total", { upstream: "shared", result: "ok" });
    expect(ok[0]! + ok[1]!).toBeGreaterThanOrEqual(1);
    const failed = await onBoth("tollgate_upstream_cooldown_probe_total", {
      upstream: "shared",
      result: "failed",
    });
    expect(failed[0]! + failed[1]!).toBe(0);
  }, 30_000);
});
