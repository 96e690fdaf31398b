import { parseGatewayConfig } from "@tollgate/config";
import { type InferenceRouter, start as startRouter } from "@tollgate/inference-router";
import { createMemoryBus } from "@tollgate/kit/bus";
import {
  type GrpcServer,
  GrpcStatus,
  type Handlers,
  implement,
  StatusError,
  serveGrpc,
} from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import { stopDeadline } from "@tollgate/kit/shutdown";
import { paymentAccess } from "@tollgate/mpp-payment/access";
import { Action, PaymentService } from "@tollgate/proto/payment";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { captureLogs } from "@tollgate/testkit/logs";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type ApiEdge, start } from "../../src/app.js";

/**
 * The paid route's control flow in api-edge, against a scripted PaymentService: what reaches
 * the model, what the caller sees, and that no receipt ever goes out without a commit. The
 * real mpp-payment and the unmodified mppx client are exercised end to end in packages/e2e.
 */
const log = createLogger({ service: "api-edge", level: "silent" });
const PATH = "/v1/mpp/chat/completions";
const CHALLENGE =
  'Payment id="ch_1", realm="tollgate", method="tempo", intent="session", request="e30", expires="2999-01-01T00:00:00.000Z"';

/** The receipt of a hold as mpp-payment writes it (VerifyResponse.reserved_receipt): 7 spent before it. */
const HELD = {
  method: "tempo",
  intent: "session",
  status: "success",
  timestamp: "2026-10-01T12:00:00.000Z",
  reference: "0xchan",
  challengeId: "ch_1",
  channelId: "0xchan",
  acceptedCumulative: "1000000",
  spent: "7",
  units: 2,
};
const encode = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
const decode = (v: string | null) => JSON.parse(Buffer.from(v ?? "", "base64url").toString("utf8"));

const calls: string[] = [];
let script: {
  verify?: () => never;
  commit?: () => void | Promise<void>;
  release?: () => void;
  receipt?: string;
  /** A replica that predates reserved_receipt: no hold from Verify, Reserve without a receipt. */
  legacy?: boolean;
} = {};

const payment: Handlers<typeof PaymentService> = {
  async challenge(req) {
    calls.push(`challenge:${req.request?.plan}`);
    return { wwwAuthenticate: CHALLENGE, challengeId: "ch_1", binding: { model: "small", outputCap: 5 } };
  },
  async verify(req) {
    calls.push("verify");
    script.verify?.();
    const bodyless = req.body.length === 0;
    return {
      action: Action.VOUCHER,
      channelId: "0xchan",
      challengeId: "ch_1",
      binding: { model: "small", outputCap: 5, plan: "Starter" },
      acceptedCumulative: "1000000",
      quote: "100",
      paymentReceipt: bodyless ? "mgmt-receipt" : "",
      ...(bodyless || script.legacy ? {} : { reservationId: "res_1", reservedReceipt: encode(HELD) }),
    };
  },
  async reserve() {
    calls.push("reserve");
    return { reservationId: "res_1" };
  },
  async commit(req) {
    calls.push(`commit:${req.actualCost}`);
    await script.commit?.();
    return { paymentReceipt: script.receipt ?? "receipt-after-commit" };
  },
  async release() {
    calls.push("release");
    script.release?.();
    return {};
  },
  async close() {
    calls.push("close");
    return { paymentReceipt: "close-receipt" };
  },
};

describe("paid route control flow (api-edge)", () => {
  let upstream: FakeUpstream;
  let router: InferenceRouter;
  let paymentServer: GrpcServer;
  let edge: ApiEdge;
  let url: string;
  /** An api-edge on the test's router and scripted PaymentService. */
  const startEdge = (logger: typeof log) =>
    start(
      {
        host: "127.0.0.1",
        port: 0,
        authPolicyAddr: "127.0.0.1:1",
        inferenceRouterAddr: `127.0.0.1:${router.port}`,
        mppPaymentAddr: `127.0.0.1:${paymentServer.port}`,
        limits: { bodyLimitBytes: 1024 * 1024 },
      },
      logger,
    );

  beforeAll(async () => {
    upstream = await startFakeUpstream({ record: true });
    const gateway = parseGatewayConfig({
      // One attempt per request: a test injects one upstream failure and expects to see it.
      resilience: { retry: { maxAttempts: 1 } },
      upstreams: [{ id: "fake", baseUrl: upstream.url }],
      models: [
        {
          id: "small",
          upstream: "fake",
          upstreamModel: "fake-small",
          runtime: "vllm",
          pricing: { inputPerMillion: 1000, outputPerMillion: 2000 },
        },
      ],
    });
    router = await startRouter({ grpcHost: "127.0.0.1", grpcPort: 0, gateway, upstreamKeys: {} }, log, {
      bus: createMemoryBus(),
    });
    paymentServer = await serveGrpc({
      host: "127.0.0.1",
      port: 0,
      log,
      services: [implement(PaymentService, payment, paymentAccess)],
    });
    edge = await startEdge(log);
    url = `http://127.0.0.1:${edge.port}${PATH}`;
  });

  afterAll(async () => {
    await edge?.stop();
    await paymentServer?.stop(100);
    await router?.stop();
    await upstream?.close();
  });

  beforeEach(() => {
    calls.length = 0;
    script = {};
  });

  const body = {
    plan: "Starter",
    model_optimization: true,
    max_tokens: 5,
    messages: [{ role: "user", content: "hi" }],
  };
  const post = (b: unknown, headers: Record<string, string> = {}) =>
    fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: typeof b === "string" ? b : JSON.stringify(b),
    });

  it("answers an unpaid valid request with 402, a Payment challenge and code payment_required", async () => {
    const before = upstream.requests.length;
    const res = await post(body);
    expect(res.status).toBe(402);
    expect(res.headers.get("www-authenticate")).toBe(CHALLENGE);
    expect(res.headers.get("cache-control")).toBe("no-store");
    expect(res.headers.get("content-type")).toContain("application/problem+json");
    const problem = (await res.json()) as { code: string; status: number; challengeId: string };
    expect(problem).toMatchObject({ code: "payment_required", status: 402, challengeId: "ch_1" });
    expect(upstream.requests.length).toBe(before);
  });

  it.each([
    ["a Virtual Key", { authorization: "Bearer tg_demo_key_00000000000000000000" }, 401, "wrong_auth_scheme"],
    ["another scheme", { authorization: "Basic abc" }, 401, "wrong_auth_scheme"],
  ])("refuses %s with 401", async (_l, headers, status, code) => {
    const res = await post(body, headers);
    expect(res.status).toBe(status);
    expect(((await res.json()) as { code: string }).code).toBe(code);
    expect(calls).toEqual([]);
  });

  it.each([
    ["stream: true", { ...body, stream: true }, "mpp_streaming_unavailable"],
    ["no plan", { ...body, plan: undefined }, "invalid_request"],
    ["an unknown plan", { ...body, plan: "Gold" }, "invalid_request"],
    ["model with model_optimization true", { ...body, model: "small" }, "invalid_request"],
    ["no model with model_optimization false", { ...body, model_optimization: false }, "invalid_request"],
    ["no output cap", { ...body, max_tokens: undefined }, "invalid_request"],
    ["no messages", { ...body, messages: undefined }, "invalid_request"],
  ])("refuses %s with 400 before any challenge or model", async (_l, b, code) => {
    const before = upstream.requests.length;
    const res = await post(b);
    expect(res.status).toBe(400);
    expect(((await res.json()) as { code: string }).code).toBe(code);
    expect(calls).toEqual([]);
    expect(upstream.requests.length).toBe(before);
  });

  it("keeps HEAD disabled and never runs a model", async () => {
    const before = upstream.requests.length;
    const res = await fetch(url, { method: "HEAD" });
    expect(res.status).toBe(405);
    expect(upstream.requests.length).toBe(before);
  });

  it("answers a paid request after one mpp-payment call: the hold's receipt plus the charge; Commit follows the answer", async () => {
    let commitArrived!: () => void;
    const arrived = new Promise<void>((r) => {
      commitArrived = r;
    });
    let answered!: () => void;
    const answer = new Promise<void>((r) => {
      answered = r;
    });
    // The Commit is held until the caller has its answer: only an answer that does not wait for
    // it can arrive.
    script.commit = async () => {
      commitArrived();
      await answer;
    };
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(200);
    // Before the answer: Verify, which took the hold, and nothing else, but the Commit is on its way.
    await arrived;
    const onPath = [...calls];
    answered();
    const cost = res.headers.get("x-tollgate-cost");
    expect(cost).toMatch(/^[1-9][0-9]*$/);
    expect(onPath).toEqual(["verify", `commit:${cost}`]);
    expect(decode(res.headers.get("payment-receipt"))).toEqual({
      ...HELD,
      spent: String(7n + BigInt(cost!)),
      units: 3,
      timestamp: expect.any(String),
    });
    expect(res.headers.get("cache-control")).toBe("private");
    const json = (await res.json()) as { choices: Array<{ message: { content: string } }> };
    expect(json.choices[0]?.message.content.length).toBeGreaterThan(0);
    expect(calls).toEqual(["verify", `commit:${cost}`]);
  });

  it("runs a Commit sent after the answer again when it met a Redis outage", async () => {
    const outage = new StatusError(GrpcStatus.UNAVAILABLE, "store_unavailable", "store unavailable");
    let failures = 2;
    let committed!: () => void;
    const done = new Promise<void>((r) => {
      committed = r;
    });
    script.commit = () => {
      if (failures-- > 0) throw outage;
      committed();
    };
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(200);
    expect(decode(res.headers.get("payment-receipt")).units).toBe(3);
    await done;
    expect(calls.filter((c) => c.startsWith("commit:"))).toHaveLength(3);
  });

  it("releases the hold Verify took and sends no receipt when inference fails", async () => {
    upstream.failNext(1, { status: 500 });
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(502);
    expect(res.headers.get("payment-receipt")).toBeNull();
    expect(calls).toEqual(["verify", "release"]);
  });

  it("with a replica that predates the hold's receipt: verify, reserve, model, commit, then the receipt", async () => {
    script.legacy = true;
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(200);
    expect(res.headers.get("payment-receipt")).toBe("receipt-after-commit");
    expect(res.headers.get("cache-control")).toBe("private");
    const json = (await res.json()) as { choices: Array<{ message: { content: string } }> };
    expect(json.choices[0]?.message.content.length).toBeGreaterThan(0);
    expect(calls[0]).toBe("verify");
    expect(calls[1]).toBe("reserve");
    expect(calls[2]).toMatch(/^commit:\d+$/);
    expect(calls).toHaveLength(3);
    expect(upstream.requests.at(-1)?.body).toMatchObject({ max_tokens: 5 });
  });

  it("releases the hold and sends no receipt when inference fails", async () => {
    script.legacy = true;
    upstream.failNext(1, { status: 500 });
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(502);
    expect(res.headers.get("payment-receipt")).toBeNull();
    expect(calls).toEqual(["verify", "reserve", "release"]);
  });

  it("sends no content and no receipt when the commit fails (mpp_commit_failed)", async () => {
    script.legacy = true;
    script.commit = () => {
      throw new StatusError(GrpcStatus.UNAVAILABLE, "mpp_commit_failed", "store down");
    };
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(500);
    expect(res.headers.get("payment-receipt")).toBeNull();
    const problem = (await res.json()) as { code: string; choices?: unknown };
    expect(problem.code).toBe("mpp_commit_failed");
    expect(problem.choices).toBeUndefined();
  });

  it("runs a Commit that met a Redis outage again once the store answers: the receipt follows", async () => {
    script.legacy = true;
    // What kit's bridge answers for a call whose Redis is down or restarting.
    const outage = new StatusError(GrpcStatus.UNAVAILABLE, "store_unavailable", "store unavailable");
    let failures = 2;
    script.commit = () => {
      if (failures-- > 0) throw outage;
    };
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(200);
    expect(res.headers.get("payment-receipt")).toBe("receipt-after-commit");
    expect(calls.filter((c) => c.startsWith("commit:"))).toHaveLength(3);

    // A Release likewise: the hold goes back once Redis answers, not with its TTL.
    upstream.failNext(1, { status: 500 });
    calls.length = 0;
    failures = 1;
    script.release = () => {
      if (failures-- > 0) throw outage;
    };
    const failed = await post(body, { authorization: "Payment abc" });
    expect(failed.status).toBe(502);
    expect(calls).toEqual(["verify", "reserve", "release", "release"]);
  });

  it("never answers 200 without a receipt, even if the commit returns none", async () => {
    script.legacy = true;
    script.receipt = "";
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(500);
    expect(res.headers.get("payment-receipt")).toBeNull();
  });

  it("attaches a fresh challenge to a 402 from verification", async () => {
    script.verify = () => {
      throw new StatusError(
        GrpcStatus.FAILED_PRECONDITION,
        "mpp_voucher_bucket_refresh_required",
        "sign a higher voucher",
      );
    };
    const res = await post(body, { authorization: "Payment abc" });
    expect(res.status).toBe(402);
    expect(res.headers.get("www-authenticate")).toBe(CHALLENGE);
    expect(((await res.json()) as { code: string }).code).toBe("mpp_voucher_bucket_refresh_required");
    expect(calls).toEqual(["verify", "challenge:Starter"]);
  });

  it("stops within its deadline while a Commit sent after the answer still retrying, naming the reservation it leaves", async () => {
    // An api-edge of its own, stopped here; mpp-payment's store stays away for its Commit.
    const logs = captureLogs();
    const own = await startEdge(
      createLogger({ service: "api-edge", level: "warn", destination: logs.stream }),
    );
    let commitTried!: () => void;
    const tried = new Promise<void>((r) => {
      commitTried = r;
    });
    script.commit = () => {
      commitTried();
      throw new StatusError(GrpcStatus.UNAVAILABLE, "store_unavailable", "store unavailable");
    };
    const res = await fetch(`http://127.0.0.1:${own.port}${PATH}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Payment abc" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    await tried;
    // A 1.5 s deadline: the Commit's own wait (10 s) would pass it.
    const began = Date.now();
    await own.stop(stopDeadline(1_500));
    const took = Date.now() - began;
    expect(took).toBeGreaterThanOrEqual(1_000);
    expect(took).toBeLessThan(3_000);
    const left = logs.records().filter((r) => String(r["msg"]).includes("left to metering's commit"));
    expect(left).toHaveLength(1);
    expect(left[0]?.["reservationId"]).toBe("res_1");
  });

  it("answers a bodyless management credential with 204 and its receipt, without a model", async () => {
    const before = upstream.requests.length;
    const res = await fetch(url, { method: "POST", headers: { authorization: "Payment abc" } });
    expect(res.status).toBe(204);
    expect(res.headers.get("payment-receipt")).toBe("mgmt-receipt");
    expect(upstream.requests.length).toBe(before);
  });
});
