import type { ChildProcess } from "node:child_process";
import { Agent, type IncomingMessage, request } from "node:http";
import { jetstream } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { createClient } from "@tollgate/kit/grpc";
import { MeteringService } from "@tollgate/proto/metering";
import { natsNames } from "@tollgate/proto/subjects";
import { usageEventsOf } from "@tollgate/proto/usage";
import { expectedOutput } from "@tollgate/testkit/fake-upstream";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * Graceful shutdown (docs/runbooks/README.md, "Shutdown"): a process receiving SIGTERM, as Kubernetes sends
 * it, finishes the streams it is serving before it exits. The fake upstream is slow (100 ms to
 * the first chunk, then 10 tokens a second), so every stream below is mid-way when the signal
 * arrives and needs about three more seconds to finish.
 */
const TTFT_MS = 100;
const TOKENS_PER_SECOND = 10;
const OUTPUT_TOKENS = 30;
/** What the fake produces without a cap; above OUTPUT_TOKENS, so the cap decides. */
const UPSTREAM_OUTPUT_TOKENS = 64;
/** The demo config serves tollgate-mini from the fake's "fake-small". */
const MODEL = "tollgate-mini";
const UPSTREAM_MODEL = "fake-small";
/** How long any single request may take before the test calls it a hang. */
const NO_HANG_MS = 15_000;

/** A client of the stack's metering, calling as api-edge does (its usage totals, read directly). */
function meteringClientOf(stack: Stack) {
  const metering = stack.processes.find((p) => p.name === "metering")!;
  return createClient(MeteringService, `127.0.0.1:${metering.port}`, stack.internalAuth("api-edge"));
}

describe("graceful shutdown on SIGTERM (multi-process stack, two routers)", () => {
  const namespace = uniqueNamespace("drain");
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  /** Every request this file got a 200 for, with the cost the gateway reported for it. */
  const served = new Map<string, { cost: bigint; outputTokens: number }>();
  /** Keeps every connection open after its response, as a proxy in front of api-edge would. */
  const keepAlive = new Agent({ keepAlive: true });

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 2,
      upstreamEnv: {
        FAKE_TTFT_MS: String(TTFT_MS),
        FAKE_TOKENS_PER_SECOND: String(TOKENS_PER_SECOND),
        FAKE_OUTPUT_TOKENS: String(UPSTREAM_OUTPUT_TOKENS),
      },
    });
  });

  afterAll(async () => {
    keepAlive.destroy();
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  const chatBody = (prompt: string, stream: boolean) => ({
    model: MODEL,
    max_tokens: OUTPUT_TOKENS,
    stream,
    ...(stream ? { stream_options: { include_usage: true } } : {}),
    messages: [{ role: "user", content: prompt }],
  });

  /** The text the fake upstream produces for a body (it seeds its words with its own model id). */
  const expectedText = (body: ReturnType<typeof chatBody>) =>
    expectedOutput({ ...body, model: UPSTREAM_MODEL }, { outputTokens: UPSTREAM_OUTPUT_TOKENS }).texts[0];

  /** One streamed chat completion read event by event, timed on this process's clock. */
  interface StreamRun {
    requestId: string;
    expected: string | undefined;
    /** Resolves when the first data event has arrived (the stream is then mid-way). */
    started: Promise<void>;
    /** Resolves when the response body ends, however it ends. */
    finished: Promise<{
      status: number;
      text: string;
      done: boolean;
      outputTokens: number;
      cost: bigint | undefined;
      endedAt: number;
    }>;
  }

  /**
   * Sends one request over the shared keep-alive agent and hands its response to `onResponse`.
   * A caller that keeps connections open (an ingress, a load balancer, a browser) is what a
   * draining server has to cope with, so every request here leaves its socket idle in the pool.
   */
  function post(
    url: string,
    requestId: string,
    body: unknown,
    onResponse: (res: IncomingMessage) => void,
    onError: (err: Error) => void,
  ): void {
    const req = request(
      `${url}/v1/chat/completions`,
      {
        method: "POST",
        agent: keepAlive,
        headers: {
          authorization: `Bearer ${stack.demoKey}`,
          "content-type": "application/json",
          "x-request-id": requestId,
        },
        timeout: NO_HANG_MS,
      },
      onResponse,
    );
    req.on("timeout", () => req.destroy(new Error("hung")));
    req.on("error", onError);
    req.end(JSON.stringify(body));
  }

  function openStream(url: string, requestId: string, prompt: string): StreamRun {
    const body = chatBody(prompt, true);
    let markStarted: () => void = () => {};
    const started = new Promise<void>((resolve) => {
      markStarted = resolve;
    });
    const finished = new Promise<Awaited<StreamRun["finished"]>>((resolve, reject) => {
      post(
        url,
        requestId,
        body,
        (res) => {
          let text = "";
          let done = false;
          let outputTokens = 0;
          let cost: bigint | undefined;
          let buffer = "";
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => {
            buffer += chunk;
            for (let cut = buffer.indexOf("\n\n"); cut >= 0; cut = buffer.indexOf("\n\n")) {
              const event = buffer.slice(0, cut);
              buffer = buffer.slice(cut + 2);
              if (!event.startsWith("data: ")) continue;
              markStarted();
              const data = event.slice("data: ".length);
              if (data === "[DONE]") {
                done = true;
                continue;
              }
              const json = JSON.parse(data) as {
                choices: Array<{ delta?: { content?: string } }>;
                usage?: { completion_tokens: number };
                x_tollgate?: { cost: string };
              };
              text += json.choices[0]?.delta?.content ?? "";
              if (json.usage) outputTokens = json.usage.completion_tokens;
              if (json.x_tollgate) cost = BigInt(json.x_tollgate.cost);
            }
          });
          res.on("end", () => {
            markStarted();
            resolve({
              status: res.statusCode ?? 0,
              text,
              done,
              outputTokens,
              cost,
              endedAt: performance.now(),
            });
          });
          res.on("error", reject);
        },
        (err) => {
          markStarted();
          reject(err);
        },
      );
    });
    return { requestId, expected: expectedText(body), started, finished };
  }

  /** A buffered chat completion: its status, error code, cost and tokens. */
  function buffered(url: string, requestId: string, prompt: string) {
    return new Promise<{ status: number; code: string | undefined; cost: bigint; outputTokens: number }>(
      (resolve, reject) =>
        post(
          url,
          requestId,
          chatBody(prompt, false),
          (res) => {
            let text = "";
            res.setEncoding("utf8");
            res.on("data", (chunk: string) => {
              text += chunk;
            });
            res.on("end", () => {
              const json = JSON.parse(text) as {
                usage?: { completion_tokens: number };
                error?: { code: string };
              };
              resolve({
                status: res.statusCode ?? 0,
                code: json.error?.code,
                cost: BigInt((res.headers["x-tollgate-cost"] as string | undefined) ?? "0"),
                outputTokens: json.usage?.completion_tokens ?? 0,
              });
            });
            res.on("error", reject);
          },
          reject,
        ),
    );
  }

  /** Sends SIGTERM and resolves with how the process ended and when (this process's clock). */
  function terminate(child: ChildProcess) {
    expect(child.exitCode).toBeNull();
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>(
      (resolve) => child.once("exit", (code, signal) => resolve({ code, signal, at: performance.now() })),
    );
    const sentAt = performance.now();
    child.kill("SIGTERM");
    return { sentAt, exited };
  }

  /** Streams whose first chunk each router has produced, from its own /metrics. */
  async function ttftCount(name: string): Promise<number> {
    const text = await (await fetch(stack.metricsUrls[name]!)).text();
    let count = 0;
    for (const m of text.matchAll(/^tollgate_upstream_latency_seconds_count\{([^}]*)\} (\d+)$/gm)) {
      if (m[1]!.includes('phase="ttft"')) count += Number(m[2]);
    }
    return count;
  }

  /** Waits until the totals `read` returns count every served request, then reads them once more. */
  async function meteredTotals(
    read: () => Promise<{ requests: number; output_tokens: number; cost: string }>,
  ) {
    let totals = await read();
    for (let i = 0; i < 100 && totals.requests < served.size; i++) {
      await new Promise((r) => setTimeout(r, 100));
      totals = await read();
    }
    // A second count of any event (a redelivery, a double publish) would show up by now.
    await new Promise((r) => setTimeout(r, 1_000));
    return read();
  }

  /** Usage events JetStream stored for each request id of this run. */
  async function storedEventsByRequest(): Promise<Map<string, number>> {
    const nc = await connect({ servers: nats.url });
    try {
      const consumer = await jetstream(nc).consumers.get(natsNames(namespace).usageStream);
      const counts = new Map<string, number>();
      const batch = await consumer.fetch({ max_messages: 1000, expires: 1_500 });
      for await (const m of batch) {
        for (const e of usageEventsOf(m.subject, m.data)) {
          counts.set(e.requestId, (counts.get(e.requestId) ?? 0) + 1);
        }
        if (m.info.pending === 0) break;
      }
      return counts;
    } finally {
      await nc.close();
    }
  }

  it("an inference-router finishes its in-flight streams before it exits 0, the other replica takes new requests, and usage counts once", async () => {
    const routers = ["inference-router-1", "inference-router-2"];
    // Start the streams one at a time and see, from each router's ttft counter, which one serves it.
    const runs: Array<StreamRun & { router: string }> = [];
    for (let i = 0; i < 6; i++) {
      const before = await Promise.all(routers.map(ttftCount));
      const run = openStream(stack.url, `${namespace}-inflight-${i}`, `drain test stream ${i}`);
      await run.started;
      const after = await Promise.all(routers.map(ttftCount));
      const owner = routers.filter((_, r) => after[r]! > before[r]!);
      expect(owner).toHaveLength(1);
      runs.push({ ...run, router: owner[0]! });
    }
    const victim = "inference-router-1";
    const onVictim = runs.filter((r) => r.router === victim);
    expect(onVictim.length).toBeGreaterThan(0);
    expect(runs.length - onVictim.length).toBeGreaterThan(0);

    const router = stack.processes.find((p) => p.name === victim)!;
    const { sentAt, exited } = terminate(router.child);

    // While it drains, new requests (buffered and streamed) are sent; each has NO_HANG_MS to
    // answer, and (below) all must be served, by the other replica.
    await new Promise((r) => setTimeout(r, 100));
    expect(router.child.exitCode).toBeNull();
    const newStreams = [0, 1].map((i) =>
      openStream(stack.url, `${namespace}-during-stream-${i}`, `drain test new stream ${i}`),
    );
    const newBuffered = await Promise.all(
      [0, 1, 2, 3].map((i) =>
        buffered(stack.url, `${namespace}-during-buffered-${i}`, `drain buffered ${i}`),
      ),
    );
    const bufferedDoneAt = performance.now();
    expect(router.child.exitCode).toBeNull(); // still draining: these really were sent mid-drain

    const results = await Promise.all(runs.map((r) => r.finished));
    const exit = await exited;

    // Every in-flight stream, on either replica, finished whole and with the terminator.
    for (const [i, r] of results.entries()) {
      expect(r.status).toBe(200);
      expect(r.text).toBe(runs[i]!.expected);
      expect(r.done).toBe(true);
      expect(r.outputTokens).toBe(OUTPUT_TOKENS);
      expect(r.cost).toBeGreaterThan(0n);
      served.set(runs[i]!.requestId, { cost: r.cost!, outputTokens: r.outputTokens });
    }
    // The router exited cleanly, and only after the last of its own streams had ended.
    expect(exit).toMatchObject({ code: 0, signal: null });
    const lastOwnEnd = Math.max(...onVictim.map((r) => results[runs.indexOf(r)]!.endedAt));
    expect(exit.at).toBeGreaterThan(lastOwnEnd);
    // ...and promptly: nothing else (an idle connection, a NATS drain) holds it up.
    expect(exit.at - lastOwnEnd).toBeLessThan(3_000);

    // With a second replica up, the drain costs new callers nothing: the other one serves them.
    for (const [i, r] of newBuffered.entries()) {
      expect({ status: r.status, code: r.code }).toEqual({ status: 200, code: undefined });
      expect(r.cost).toBeGreaterThan(0n);
      served.set(`${namespace}-during-buffered-${i}`, { cost: r.cost, outputTokens: r.outputTokens });
    }
    for (const s of newStreams) {
      const r = await s.finished;
      expect(r.status).toBe(200);
      expect(r.text).toBe(s.expected);
      expect(r.done).toBe(true);
      served.set(s.requestId, { cost: r.cost!, outputTokens: r.outputTokens });
    }

    console.info(
      `inference-router drain: SIGTERM → exit ${Math.round(exit.at - sentAt)} ms ` +
        `(last own stream ended ${Math.round(lastOwnEnd - sentAt)} ms after SIGTERM; ` +
        `${onVictim.length}/${runs.length} in-flight streams on it; ` +
        `4 buffered requests sent during the drain answered in ${Math.round(bufferedDoneAt - sentAt - 100)} ms)`,
    );

    // Each served request published exactly one usage event, and metering applied each once.
    const events = await storedEventsByRequest();
    for (const id of served.keys()) expect(events.get(id), id).toBe(1);
    const totals = await meteredTotals(async () => {
      const res = await fetch(`${stack.adminUrls[0]}/admin/v1/usage?account=demo`, {
        headers: { authorization: `Bearer ${stack.adminToken}` },
      });
      expect(res.status).toBe(200);
      return ((await res.json()) as { totals: { requests: number; output_tokens: number; cost: string } })
        .totals;
    });
    expect(totals.requests).toBe(served.size);
    expect(totals.output_tokens).toBe([...served.values()].reduce((s, u) => s + u.outputTokens, 0));
    expect(totals.cost).toBe([...served.values()].reduce((s, u) => s + u.cost, 0n).toString());
  });

  it("api-edge finishes its in-flight streams before it exits 0, and refuses new work without hanging", async () => {
    const runs = [0, 1].map((i) =>
      openStream(stack.url, `${namespace}-edge-inflight-${i}`, `edge drain stream ${i}`),
    );
    await Promise.all(runs.map((r) => r.started));
    const edge = stack.processes.find((p) => p.name === "api-edge")!;
    const { sentAt, exited } = terminate(edge.child);

    // A new request while it drains is refused at once on a new connection, or answered on a
    // kept-alive one (in the drain's first second, with `Connection: close`; a 503 after it),
    // never left waiting.
    await new Promise((r) => setTimeout(r, 100));
    expect(edge.child.exitCode).toBeNull();
    const refusedAt = performance.now();
    const lateId = `${namespace}-edge-late`;
    const late = await buffered(stack.url, lateId, "edge drain late").then(
      (r) => {
        if (r.status === 200) served.set(lateId, { cost: r.cost, outputTokens: r.outputTokens });
        return r.status;
      },
      (err: Error) => (err.message === "hung" ? "hung" : "refused"),
    );
    expect(late === "refused" || late === 200 || late === 503).toBe(true);
    expect(performance.now() - refusedAt).toBeLessThan(2_000);

    const results = await Promise.all(runs.map((r) => r.finished));
    const exit = await exited;
    for (const [i, r] of results.entries()) {
      expect(r.status).toBe(200);
      expect(r.text).toBe(runs[i]!.expected);
      expect(r.done).toBe(true);
      served.set(runs[i]!.requestId, { cost: r.cost!, outputTokens: r.outputTokens });
    }
    const lastEnd = Math.max(...results.map((r) => r.endedAt));
    console.info(
      `api-edge drain: SIGTERM → exit ${Math.round(exit.at - sentAt)} ms ` +
        `(its last stream ended ${Math.round(lastEnd - sentAt)} ms after SIGTERM; new request: ${late})`,
    );
    expect(exit).toMatchObject({ code: 0, signal: null });
    expect(exit.at).toBeGreaterThan(lastEnd);
    // The callers' kept-alive connections, idle once their streams ended, must not hold the exit
    // up until the shutdown timeout.
    expect(exit.at - lastEnd).toBeLessThan(3_000);

    // The streams it finished while draining are metered once too (asked of metering directly:
    // the admin API went away with the edge).
    const client = meteringClientOf(stack);
    try {
      const totals = await meteredTotals(async () => {
        const t = (await client.getUsage({ accountId: "demo" })).totals;
        return {
          requests: Number(t?.requests ?? 0n),
          output_tokens: Number(t?.outputTokens ?? 0n),
          cost: t?.cost || "0",
        };
      });
      expect(totals.requests).toBe(served.size);
      expect(totals.cost).toBe([...served.values()].reduce((s, u) => s + u.cost, 0n).toString());
    } finally {
      client.$close();
    }
  });
});

/**
 * The bound on a stop comes from SHUTDOWN_TIMEOUT_SECONDS (the chart sets it from the pod's grace
 * period): a router lets its streams run for that bound less 5 s, then cuts them, records what
 * they produced and exits 0 within the bound. Here the bound is 8 s and each stream needs 10 s.
 */
describe("a router's stop within SHUTDOWN_TIMEOUT_SECONDS", () => {
  const namespace = uniqueNamespace("bound");
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  const BOUND_SECONDS = 8;

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      namespace,
      routers: 1,
      serviceEnv: { SHUTDOWN_TIMEOUT_SECONDS: String(BOUND_SECONDS) },
      // 100 tokens at 10 a second: 10 s, longer than the 3 s of grace the bound leaves.
      upstreamEnv: { FAKE_TTFT_MS: "100", FAKE_TOKENS_PER_SECOND: "10", FAKE_OUTPUT_TOKENS: "100" },
    });
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  it("cuts the streams that outlast its grace, each ending 503 service_unavailable with its charge, bills what was relayed once, and exits 0 within the bound", async () => {
    /** Starts a stream and reads it until some content has arrived (mid-way). */
    const open = async (n: number) => {
      const res = await fetch(`${stack.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${stack.demoKey}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: MODEL,
          max_tokens: 100,
          stream: true,
          messages: [{ role: "user", content: `stream ${n}, longer than the grace` }],
        }),
      });
      expect(res.status).toBe(200);
      const reader = res.body!.getReader();
      const decoder = new TextDecoder();
      let text = "";
      while (!text.includes('"content":"')) text += decoder.decode((await reader.read()).value);
      return async () => {
        for (let r = await reader.read(); !r.done; r = await reader.read()) text += decoder.decode(r.value);
        return text;
      };
    };
    // Several at once: each of them is cut, and each must be told the same.
    const rest = await Promise.all([0, 1, 2].map(open));

    const router = stack.processes.find((p) => p.name.startsWith("inference-router"))!;
    const exited = new Promise<{ code: number | null; at: number }>((resolve) =>
      router.child.once("exit", (code) => resolve({ code, at: performance.now() })),
    );
    const sentAt = performance.now();
    router.child.kill("SIGTERM");
    const texts = await Promise.all(rest.map((read) => read()));
    const exit = await exited;

    // Cut at the grace (8 − 5 = 3 s), not at the stream's end (10 s) nor the default bound's 20 s.
    expect(exit.code).toBe(0);
    expect(exit.at - sentAt).toBeLessThan((BOUND_SECONDS - 1) * 1_000);
    let told = 0n;
    for (const text of texts) {
      expect(text).not.toContain("data: [DONE]");
      const events = text
        .split("\n\n")
        .filter((e) => e.startsWith("data: "))
        .map((e) => JSON.parse(e.slice("data: ".length)) as Record<string, unknown>);
      const last = events.at(-1) as { error?: { code?: string }; x_tollgate?: { cost?: string } };
      // The error event names the cut (the router stopping: 503, never a 500) and tells the
      // charge of what was relayed.
      expect(last.error?.code).toBe("service_unavailable");
      expect(last.x_tollgate?.cost).toMatch(/^[1-9][0-9]*$/);
      told += BigInt(last.x_tollgate!.cost!);
      const relayed = events.filter(
        (e) => (e as { choices?: Array<{ delta?: { content?: string } }> }).choices?.[0]?.delta?.content,
      ).length;
      expect(relayed).toBeGreaterThan(0);
      expect(relayed).toBeLessThan(100);
    }

    // What was relayed is metered once: one request per stream, the costs the callers were told.
    const client = meteringClientOf(stack);
    try {
      let totals = (await client.getUsage({ accountId: "demo" })).totals;
      for (let i = 0; i < 100 && Number(totals?.requests ?? 0n) < texts.length; i++) {
        await new Promise((r) => setTimeout(r, 100));
        totals = (await client.getUsage({ accountId: "demo" })).totals;
      }
      await new Promise((r) => setTimeout(r, 1_000));
      totals = (await client.getUsage({ accountId: "demo" })).totals;
      expect(Number(totals?.requests ?? 0n)).toBe(texts.length);
      expect(Number(totals?.outputTokens ?? 0n)).toBeGreaterThan(0);
      expect(Number(totals?.outputTokens ?? 0n)).toBeLessThan(100 * texts.length);
      expect(totals?.cost).toBe(told.toString());
    } finally {
      client.$close();
    }
  });
});

/**
 * api-edge drained while callers keep their connections busy, as a load balancer's pool does:
 * closing a kept-alive connection between two of its requests would cut the next one, already
 * sent (docs/runbooks/api-edge.md, "Graceful shutdown").
 */
describe("api-edge's drain under keep-alive load", () => {
  const namespace = uniqueNamespace("drainload");
  const CALLERS = 8;
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;

  beforeAll(async () => {
    nats = await useNats();
    redis = await useRedis();
    stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1 });
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  it("answers every request sent on a kept-alive connection while it drains, cuts none, and meters each once", async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: CALLERS });
    const body = JSON.stringify({
      model: MODEL,
      max_tokens: 8,
      messages: [{ role: "user", content: "busy" }],
    });
    let told = 0n;
    /** "200", another status, "refused" (a new connection after the drain began) or "cut: …". */
    const send = () =>
      new Promise<string>((resolve) => {
        const req = request(
          `${stack.url}/v1/chat/completions`,
          {
            method: "POST",
            agent,
            headers: { authorization: `Bearer ${stack.demoKey}`, "content-type": "application/json" },
            timeout: NO_HANG_MS,
          },
          (res) => {
            res.resume();
            res.on("end", () => {
              if (res.statusCode === 200) told += BigInt(res.headers["x-tollgate-cost"] as string);
              resolve(String(res.statusCode));
            });
            res.on("error", (err) => resolve(`cut: ${err.message}`));
          },
        );
        req.on("timeout", () => req.destroy(new Error("hung")));
        req.on("error", (err: NodeJS.ErrnoException) =>
          resolve(err.code === "ECONNREFUSED" ? "refused" : `cut: ${err.code ?? err.message}`),
        );
        req.end(body);
      });
    const outcomes: string[] = [];
    const callers = Array.from({ length: CALLERS }, async () => {
      for (;;) {
        const outcome = await send();
        outcomes.push(outcome);
        if (outcome !== "200") return;
      }
    });
    await new Promise((r) => setTimeout(r, 1_500));
    const edge = stack.processes.find((p) => p.name === "api-edge")!;
    const exited = new Promise<number | null>((resolve) => edge.child.once("exit", (code) => resolve(code)));
    edge.child.kill("SIGTERM");
    await Promise.all(callers);
    const code = await exited;
    agent.destroy();

    const count = (o: string) => outcomes.filter((x) => x === o).length;
    console.info(
      `api-edge drain under load: ${count("200")} served, ${count("refused")} refused, others: ${outcomes.filter((o) => o !== "200" && o !== "refused").join(", ") || "none"}`,
    );
    expect(outcomes.filter((o) => o !== "200" && o !== "refused")).toEqual([]);
    expect(count("refused")).toBe(CALLERS);
    expect(code).toBe(0);

    const client = meteringClientOf(stack);
    try {
      const t0 = Date.now();
      for (;;) {
        const t = (await client.getUsage({ accountId: "demo" })).totals;
        if (Number(t?.requests ?? 0n) >= count("200") || Date.now() - t0 > 10_000) {
          expect(Number(t?.requests ?? 0n)).toBe(count("200"));
          expect(t?.cost).toBe(told.toString());
          break;
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    } finally {
      client.$close();
    }
  });
});
