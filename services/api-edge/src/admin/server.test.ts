import type { AddressInfo } from "node:net";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { createLogger } from "@tollgate/kit/log";
import {
  AccountSchema,
  BudgetPeriod,
  ConnectionSchema,
  KeyInfoSchema,
  KeyState,
  type RotateKeyRequest,
  Route,
} from "@tollgate/proto/auth";
import { ERRORS, type ErrorCode, isErrorCode } from "@tollgate/proto/errors";
import { GetUsageResponseSchema, Granularity } from "@tollgate/proto/metering";
import { rawExchange } from "@tollgate/testkit/raw-http";
import type { FastifyInstance } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { type AdminAuthClient, type AdminLeases, type AdminMeteringClient, buildAdminApp } from "./server.js";

const TOKEN = "admin-token-0123456789abcdef";
const SECRET = "tg_0123456789abcdefghijABCDEFGHIJ0123456789";
const T0 = new Date("2030-01-02T03:04:05.000Z");

const key = (over: Omit<MessageInitShape<typeof KeyInfoSchema>, "$typeName"> = {}) =>
  create(KeyInfoSchema, {
    keyId: "key_1",
    accountId: "acme",
    connectionId: "main",
    name: "ci",
    createdAt: timestampFromDate(T0),
    last4: "6789",
    state: KeyState.ACTIVE,
    ...over,
  });

/** Records every call and answers with canned responses (or throws `fail`). */
function fakes() {
  const calls: { rpc: string; req: unknown }[] = [];
  let fail: Error | undefined;
  const answer = <T>(rpc: string, req: unknown, res: T): Promise<T> => {
    calls.push({ rpc, req });
    return fail ? Promise.reject(fail) : Promise.resolve(res);
  };
  const auth: AdminAuthClient = {
    createAccount: (req) =>
      answer("createAccount", req, {
        $typeName: "tollgate.auth.v1.CreateAccountResponse",
        account: create(AccountSchema, {
          accountId: req.accountId ?? "",
          limits: req.limits ?? {},
          createdAt: timestampFromDate(T0),
        }),
      }),
    createConnection: (req) =>
      answer("createConnection", req, {
        $typeName: "tollgate.auth.v1.CreateConnectionResponse",
        connection: create(ConnectionSchema, {
          accountId: req.accountId ?? "",
          connectionId: req.connectionId ?? "",
          models: req.models ?? [],
          defaultModel: req.defaultModel || req.models?.[0] || "",
          defaultMaxOutputTokens: req.defaultMaxOutputTokens ?? 1024,
          maxOutputTokens: req.maxOutputTokens ?? 4096,
          routes: req.routes ?? [],
          limits: req.limits ?? {},
          ...(req.budget ? { budget: req.budget } : {}),
          createdAt: timestampFromDate(T0),
        }),
      }),
    createKey: (req) =>
      answer("createKey", req, {
        $typeName: "tollgate.auth.v1.CreateKeyResponse",
        key: key(req.budget ? { budget: req.budget } : {}),
        secret: SECRET,
      }),
    listKeys: (req) =>
      answer("listKeys", req, {
        $typeName: "tollgate.auth.v1.ListKeysResponse",
        keys: [key(), key({ keyId: "key_2", state: KeyState.REVOKED, revokedAt: timestampFromDate(T0) })],
      }),
    revokeKey: (req) =>
      answer("revokeKey", req, {
        $typeName: "tollgate.auth.v1.RevokeKeyResponse",
        key: key({ state: KeyState.REVOKED, revokedAt: timestampFromDate(T0) }),
      }),
    rotateKey: (req) =>
      answer("rotateKey", req, {
        $typeName: "tollgate.auth.v1.RotateKeyResponse",
        oldKey: key({
          state: KeyState.ROTATING,
          rotatedTo: "key_2",
          graceEndsAt: timestampFromDate(new Date(T0.getTime() + 60_000)),
        }),
        newKey: key({ keyId: "key_2", rotatedFrom: "key_1", last4: "WXYZ" }),
        secret: SECRET,
      }),
    listAccounts: (req) =>
      answer("listAccounts", req, {
        $typeName: "tollgate.auth.v1.ListAccountsResponse",
        accounts: [create(AccountSchema, { accountId: "acme", createdAt: timestampFromDate(T0) })],
      }),
    getAccount: (req) =>
      answer("getAccount", req, {
        $typeName: "tollgate.auth.v1.GetAccountResponse",
        account: create(AccountSchema, { accountId: req.accountId ?? "", createdAt: timestampFromDate(T0) }),
        connections: [
          create(ConnectionSchema, { accountId: req.accountId ?? "", connectionId: "main", models: ["a"] }),
        ],
      }),
    updateAccount: (req) =>
      answer("updateAccount", req, {
        $typeName: "tollgate.auth.v1.UpdateAccountResponse",
        account: create(AccountSchema, { accountId: req.accountId ?? "", limits: req.limits ?? {} }),
      }),
    deleteAccount: (req) =>
      answer("deleteAccount", req, {
        $typeName: "tollgate.auth.v1.DeleteAccountResponse",
        revokedKeys: [key({ state: KeyState.REVOKED, revokedAt: timestampFromDate(T0) })],
      }),
    getConnection: (req) =>
      answer("getConnection", req, {
        $typeName: "tollgate.auth.v1.GetConnectionResponse",
        connection: create(ConnectionSchema, {
          accountId: req.accountId ?? "",
          connectionId: req.connectionId ?? "",
        }),
      }),
    updateConnection: (req) =>
      answer("updateConnection", req, {
        $typeName: "tollgate.auth.v1.UpdateConnectionResponse",
        connection: create(ConnectionSchema, {
          accountId: req.accountId ?? "",
          connectionId: req.connectionId ?? "",
          ...(req.budget ? { budget: req.budget } : {}),
        }),
      }),
    deleteConnection: (req) =>
      answer("deleteConnection", req, {
        $typeName: "tollgate.auth.v1.DeleteConnectionResponse",
        revokedKeys: [key({ state: KeyState.REVOKED, revokedAt: timestampFromDate(T0) })],
      }),
    getKey: (req) =>
      answer("getKey", req, {
        $typeName: "tollgate.auth.v1.GetKeyResponse",
        key: key({
          budget: { amount: "1000", period: BudgetPeriod.WEEK },
          budgetUsage: {
            spent: "150",
            held: "300",
            remaining: "550",
            periodStart: timestampFromDate(new Date("2030-01-07T00:00:00Z")),
            periodEnd: timestampFromDate(new Date("2030-01-14T00:00:00Z")),
          },
        }),
      }),
    updateKey: (req) =>
      answer("updateKey", req, {
        $typeName: "tollgate.auth.v1.UpdateKeyResponse",
        key: key(req.budget ? { budget: req.budget } : {}),
      }),
  };
  const metering: AdminMeteringClient = {
    getUsage: (req) =>
      answer(
        "getUsage",
        req,
        create(GetUsageResponseSchema, {
          totals: { requests: 3n, inputTokens: 30n, outputTokens: 9n, cost: "12345678901234567890" },
          buckets: [
            {
              start: timestampFromDate(new Date("2030-01-02T03:00:00Z")),
              totals: { requests: 3n, inputTokens: 30n, outputTokens: 9n, cost: "12345678901234567890" },
              ...(req.byModel ? { model: "tollgate-mini" } : {}),
            },
          ],
        }),
      ),
  };
  return {
    auth,
    metering,
    calls,
    failWith: (err: Error) => {
      fail = err;
    },
  };
}

let app: FastifyInstance;
let f: ReturnType<typeof fakes>;
let logLines: string[];

function setup(opts: { leases?: boolean } = {}) {
  f = fakes();
  logLines = [];
  const log = createLogger({ service: "api-edge", destination: { write: (l: string) => logLines.push(l) } });
  // The replica's leases: recorded among the calls, so their order is seen.
  const leases: AdminLeases = {
    returnIdleOf: async (of) => {
      f.calls.push({ rpc: "returnIdleOf", req: of });
    },
    stopLeasing: (of) => {
      f.calls.push({ rpc: "stopLeasing", req: of });
    },
  };
  app = buildAdminApp({
    token: TOKEN,
    auth: f.auth,
    metering: f.metering,
    ...(opts.leases ? { leases } : {}),
    log,
  });
  return app;
}

const auth = { authorization: `Bearer ${TOKEN}` };
const json = (body: unknown) => ({
  headers: { ...auth, "content-type": "application/json" },
  payload: JSON.stringify(body),
});

afterEach(async () => {
  await app?.close();
});

describe("admin API: the token", () => {
  it("answers 401 without a token, with a wrong one and with another scheme, on known and unknown paths", async () => {
    setup();
    const cases = [
      { headers: {}, code: "missing_admin_token" },
      { headers: { authorization: `Basic ${TOKEN}` }, code: "missing_admin_token" },
      { headers: { authorization: "Bearer wrong-token" }, code: "invalid_admin_token" },
      { headers: { authorization: `Bearer ${TOKEN}x` }, code: "invalid_admin_token" },
    ];
    for (const url of ["/admin/v1/accounts/acme/keys", "/admin/v1/nothing-here"]) {
      for (const c of cases) {
        const res = await app.inject({ method: "GET", url, headers: c.headers });
        expect(res.statusCode).toBe(401);
        expect(res.headers["www-authenticate"]).toBe('Bearer realm="tollgate-admin"');
        expect(res.json().error).toMatchObject({ type: "authentication_error", code: c.code });
      }
    }
    expect(f.calls).toEqual([]);
  });

  it("reads no body before the token is checked", async () => {
    setup();
    const res = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts",
      headers: { "content-type": "application/json" },
      payload: "{not json",
    });
    expect(res.statusCode).toBe(401);
  });

  it("answers unknown admin paths with 404 once the token is right", async () => {
    setup();
    const res = await app.inject({ method: "GET", url: "/admin/v1/nothing-here", headers: auth });
    expect(res.statusCode).toBe(404);
    expect(res.json().error).toMatchObject({ type: "not_found_error", code: "not_found" });
  });
});

describe("admin API: requests Node's parser refuses", () => {
  it("answers them with the admin error body and a request id, as every other admin error", async () => {
    setup();
    await app.listen({ host: "127.0.0.1", port: 0 });
    const { port } = app.server.address() as AddressInfo;
    for (const request of [
      // An obs-fold header, a Content-Length beside Transfer-Encoding, headers above 16 KiB.
      `GET /admin/v1/accounts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${TOKEN}\r\nX-A: a\r\n b\r\n\r\n`,
      "POST /admin/v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      `GET /admin/v1/accounts HTTP/1.1\r\nHost: x\r\nX-A: ${"a".repeat(20_000)}\r\n\r\n`,
    ]) {
      const answer = await rawExchange(port, request);
      const [head, body] = answer.split("\r\n\r\n");
      expect(head).toMatch(/^HTTP\/1\.1 4(00|31) /);
      const id = /x-request-id: (\S+)/i.exec(head ?? "")?.[1];
      expect(id).toMatch(/.+/);
      const parsed = JSON.parse(body ?? "") as { error: { code: string } };
      expect(parsed).toEqual({
        error: {
          message: expect.any(String),
          type: expect.any(String),
          code: expect.any(String),
          request_id: id,
        },
      });
      // Only codes of the admin API's own table (docs/openapi/admin.yaml's Error.code).
      const code = parsed.error.code as ErrorCode;
      expect(isErrorCode(code) && (ERRORS[code].doors as readonly string[]).includes("admin"), code).toBe(
        true,
      );
    }
    expect(f.calls).toEqual([]);
  });
});

describe("admin API: routes map to auth-policy and back", () => {
  it("creates an account with limits", async () => {
    setup();
    const res = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts",
      ...json({ id: "acme", limits: { requests_per_minute: 600 } }),
    });
    expect(res.statusCode).toBe(201);
    expect(f.calls).toEqual([
      { rpc: "createAccount", req: { accountId: "acme", limits: { requestsPerMinute: 600 } } },
    ]);
    expect(res.json()).toEqual({
      id: "acme",
      object: "account",
      limits: { requests_per_minute: 600, tokens_per_minute: null },
      created_at: T0.toISOString(),
    });
  });

  it("creates a connection: models, default, caps, routes and every limit", async () => {
    setup();
    const res = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts/acme/connections",
      ...json({
        id: "main",
        models: ["a", "b"],
        default_model: "b",
        default_max_output_tokens: 100,
        max_output_tokens: 200,
        routes: ["chat", "think"],
        limits: {
          requests_per_minute: 10,
          tokens_per_minute: 1000,
          key_requests_per_minute: 5,
          routes: { think: { requests_per_minute: 2 } },
        },
      }),
    });
    expect(res.statusCode).toBe(201);
    expect(f.calls[0]).toEqual({
      rpc: "createConnection",
      req: {
        accountId: "acme",
        connectionId: "main",
        models: ["a", "b"],
        defaultModel: "b",
        defaultMaxOutputTokens: 100,
        maxOutputTokens: 200,
        routes: [Route.CHAT_COMPLETIONS, Route.THINK],
        limits: {
          connection: { requestsPerMinute: 10, tokensPerMinute: 1000 },
          perKey: { requestsPerMinute: 5 },
          routes: [{ route: Route.THINK, limits: { requestsPerMinute: 2 } }],
        },
      },
    });
    expect(res.json()).toMatchObject({
      id: "main",
      object: "connection",
      account_id: "acme",
      models: ["a", "b"],
      default_model: "b",
      routes: ["chat", "think"],
      limits: {
        requests_per_minute: 10,
        key_requests_per_minute: 5,
        key_tokens_per_minute: null,
        routes: { think: { requests_per_minute: 2, tokens_per_minute: null } },
      },
    });
  });

  it("creates a key: 201 with the secret, not cacheable, and the secret never reaches a log line", async () => {
    setup();
    const res = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts/acme/connections/main/keys",
      ...json({ name: "ci", expires_at: "2031-01-01T00:00:00Z" }),
    });
    expect(res.statusCode).toBe(201);
    expect(res.headers["cache-control"]).toBe("no-store");
    expect(f.calls[0]).toEqual({
      rpc: "createKey",
      req: {
        accountId: "acme",
        connectionId: "main",
        name: "ci",
        expiresAt: timestampFromDate(new Date("2031-01-01T00:00:00Z")),
      },
    });
    expect(res.json()).toEqual({
      key: {
        id: "key_1",
        object: "key",
        account_id: "acme",
        connection_id: "main",
        name: "ci",
        state: "active",
        last4: "6789",
        created_at: T0.toISOString(),
        expires_at: null,
        revoked_at: null,
        rotated_from: null,
        rotated_to: null,
        grace_ends_at: null,
        budget: null,
      },
      secret: SECRET,
    });
    const logs = logLines.join("");
    expect(logs).toContain("admin action");
    expect(logs).not.toContain(SECRET);
    expect(logs).not.toContain(TOKEN);
  });

  it("sets a budget on a connection and on a key, and shows it back in base units", async () => {
    setup();
    const conn = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts/acme/connections",
      ...json({ id: "main", models: ["a"], budget: { amount: "9007199254740991", period: "week" } }),
    });
    const k = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts/acme/connections/main/keys",
      ...json({ budget: { amount: 5_000_000, period_days: 7 } }),
    });
    expect(conn.statusCode).toBe(201);
    expect(k.statusCode).toBe(201);
    expect(conn.json().budget).toEqual({ amount: "9007199254740991", period: "week" });
    expect(k.json().key.budget).toEqual({ amount: "5000000", period_days: 7 });
  });

  it("creates a key with no body at all", async () => {
    setup();
    const res = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts/acme/connections/main/keys",
      headers: auth,
    });
    expect(res.statusCode).toBe(201);
    expect(f.calls[0]?.req).toEqual({ accountId: "acme", connectionId: "main", name: "" });
  });

  it("lists keys, optionally of one connection", async () => {
    setup();
    const all = await app.inject({ method: "GET", url: "/admin/v1/accounts/acme/keys", headers: auth });
    const one = await app.inject({
      method: "GET",
      url: "/admin/v1/accounts/acme/keys?connection=main",
      headers: auth,
    });
    expect(f.calls.map((c) => c.req)).toEqual([
      { accountId: "acme", connectionId: "" },
      { accountId: "acme", connectionId: "main" },
    ]);
    expect(all.json()).toMatchObject({
      object: "list",
      data: [
        { id: "key_1", state: "active" },
        { id: "key_2", state: "revoked", revoked_at: T0.toISOString() },
      ],
    });
    expect(one.statusCode).toBe(200);
    expect(all.body).not.toContain("secret");
  });

  it("revokes a key", async () => {
    setup();
    const res = await app.inject({ method: "POST", url: "/admin/v1/keys/key_1/revoke", headers: auth });
    expect(res.statusCode).toBe(200);
    expect(f.calls[0]).toEqual({ rpc: "revokeKey", req: { keyId: "key_1" } });
    expect(res.json().key).toMatchObject({ id: "key_1", state: "revoked" });
  });

  it("rotates a key with a grace period: old and new key, and the new secret", async () => {
    setup();
    const res = await app.inject({
      method: "POST",
      url: "/admin/v1/keys/key_1/rotate",
      ...json({ grace_seconds: 0 }),
    });
    expect(res.statusCode).toBe(201);
    expect((f.calls[0]!.req as RotateKeyRequest).graceSeconds).toBe(0);
    expect(res.json()).toMatchObject({
      old_key: {
        id: "key_1",
        state: "rotating",
        rotated_to: "key_2",
        grace_ends_at: "2030-01-02T03:05:05.000Z",
      },
      new_key: { id: "key_2", rotated_from: "key_1", last4: "WXYZ" },
      secret: SECRET,
    });
    const noGrace = await app.inject({ method: "POST", url: "/admin/v1/keys/key_1/rotate", headers: auth });
    expect(noGrace.statusCode).toBe(201);
    expect(f.calls[1]?.req).toEqual({ keyId: "key_1" });
  });

  it("maps usage filters, range and granularity; money stays a decimal string", async () => {
    setup();
    const res = await app.inject({
      method: "GET",
      url: "/admin/v1/usage?account=acme&connection=main&key=key_1&model=m&from=2030-01-01&to=2030-01-03T00:00:00Z&granularity=day",
      headers: auth,
    });
    expect(res.statusCode).toBe(200);
    expect(f.calls[0]).toEqual({
      rpc: "getUsage",
      req: {
        accountId: "acme",
        connectionId: "main",
        keyId: "key_1",
        model: "m",
        from: timestampFromDate(new Date("2030-01-01T00:00:00Z")),
        to: timestampFromDate(new Date("2030-01-03T00:00:00Z")),
        granularity: Granularity.DAY,
      },
    });
    expect(res.json()).toEqual({
      object: "usage",
      granularity: "day",
      totals: {
        requests: 3,
        input_tokens: 30,
        output_tokens: 9,
        reasoning_tokens: 0,
        cost: "12345678901234567890",
      },
      buckets: [
        {
          start: "2030-01-02T03:00:00.000Z",
          requests: 3,
          input_tokens: 30,
          output_tokens: 9,
          reasoning_tokens: 0,
          cost: "12345678901234567890",
        },
      ],
    });
  });

  it("groups usage by model when asked, each bucket naming its model", async () => {
    setup();
    const res = await app.inject({
      method: "GET",
      url: "/admin/v1/usage?granularity=day&group_by=model",
      headers: auth,
    });
    expect(res.statusCode).toBe(200);
    expect(f.calls[0]?.req).toMatchObject({ granularity: Granularity.DAY, byModel: true });
    expect(res.json()).toMatchObject({
      granularity: "day",
      group_by: "model",
      buckets: [{ start: "2030-01-02T03:00:00.000Z", model: "tollgate-mini", cost: "12345678901234567890" }],
    });
    const bad = await app.inject({ method: "GET", url: "/admin/v1/usage?group_by=key", headers: auth });
    expect(bad.statusCode).toBe(400);
  });
});

describe("admin API: list, show, update and delete", () => {
  it("lists accounts and shows one with its connections", async () => {
    setup();
    const list = await app.inject({ method: "GET", url: "/admin/v1/accounts", headers: auth });
    expect(list.json()).toMatchObject({ object: "list", data: [{ id: "acme", object: "account" }] });
    const one = await app.inject({ method: "GET", url: "/admin/v1/accounts/acme", headers: auth });
    expect(one.json()).toMatchObject({
      id: "acme",
      connections: [{ id: "main", models: ["a"], budget: null }],
    });
    const conns = await app.inject({
      method: "GET",
      url: "/admin/v1/accounts/acme/connections",
      headers: auth,
    });
    expect(conns.json()).toMatchObject({ object: "list", data: [{ id: "main", account_id: "acme" }] });
    const conn = await app.inject({
      method: "GET",
      url: "/admin/v1/accounts/acme/connections/main",
      headers: auth,
    });
    expect(conn.json()).toMatchObject({ id: "main", account_id: "acme" });
    expect(f.calls.map((c) => c.rpc)).toEqual(["listAccounts", "getAccount", "getAccount", "getConnection"]);
  });

  it("sets and clears budgets: a budget object sets it, null clears it", async () => {
    setup();
    const set = await app.inject({
      method: "PATCH",
      url: "/admin/v1/accounts/acme/connections/main",
      ...json({ budget: { amount: "123", period: "day" } }),
    });
    expect(set.statusCode).toBe(200);
    expect(set.json().budget).toEqual({ amount: "123", period: "day" });
    const cleared = await app.inject({
      method: "PATCH",
      url: "/admin/v1/keys/key_1",
      ...json({ budget: null }),
    });
    expect(cleared.json()).toMatchObject({ id: "key_1", budget: null });
    expect(f.calls.map((c) => c.req)).toEqual([
      { accountId: "acme", connectionId: "main", budget: { amount: "123", period: 3 }, clearBudget: false },
      { keyId: "key_1", clearBudget: true },
    ]);
    const bad = await app.inject({
      method: "PATCH",
      url: "/admin/v1/keys/key_1",
      ...json({ budget: { amount: "1.5" } }),
    });
    expect(bad.statusCode).toBe(400);
  });

  it("reads a budget amount with leading zeros as the number it writes (admin.yaml: ^\\d+$)", async () => {
    setup();
    const set = await app.inject({
      method: "PATCH",
      url: "/admin/v1/accounts/acme/connections/main",
      ...json({ budget: { amount: "000500", period: "day" } }),
    });
    expect(set.statusCode, set.body).toBe(200);
    expect(f.calls.map((c) => c.req)).toEqual([
      { accountId: "acme", connectionId: "main", budget: { amount: "500", period: 3 }, clearBudget: false },
    ]);
  });

  it("updates an account's limits and shows a key", async () => {
    setup();
    const a = await app.inject({
      method: "PATCH",
      url: "/admin/v1/accounts/acme",
      ...json({ limits: { requests_per_minute: 7 } }),
    });
    expect(a.json()).toMatchObject({
      id: "acme",
      limits: { requests_per_minute: 7, tokens_per_minute: null },
    });
    const k = await app.inject({ method: "GET", url: "/admin/v1/keys/key_1", headers: auth });
    expect(k.json()).toMatchObject({
      id: "key_1",
      object: "key",
      state: "active",
      budget: { amount: "1000", period: "week" },
      budget_usage: {
        spent: "150",
        held: "300",
        remaining: "550",
        period_start: "2030-01-07T00:00:00.000Z",
        period_end: "2030-01-14T00:00:00.000Z",
      },
    });
    expect(k.body).not.toContain(SECRET);
  });

  it("deletes a connection and an account, answering with the keys they revoked", async () => {
    setup();
    const c = await app.inject({
      method: "DELETE",
      url: "/admin/v1/accounts/acme/connections/main",
      headers: auth,
    });
    expect(c.statusCode).toBe(200);
    expect(c.json()).toMatchObject({
      id: "main",
      object: "connection",
      account_id: "acme",
      deleted: true,
      revoked_keys: [{ id: "key_1", state: "revoked" }],
    });
    const a = await app.inject({ method: "DELETE", url: "/admin/v1/accounts/acme", headers: auth });
    expect(a.json()).toMatchObject({
      id: "acme",
      object: "account",
      deleted: true,
      revoked_keys: [{ id: "key_1" }],
    });
    expect(f.calls.map((x) => x.rpc)).toEqual(["deleteConnection", "deleteAccount"]);
    expect(logLines.join("")).toContain("connection.delete");
  });
});

describe("admin API: this replica's idle leases", () => {
  it("go back before an account's, a connection's or a key's budget is read, and only then", async () => {
    setup({ leases: true });
    const reads = [
      ["/admin/v1/keys/key_1", { keyId: "key_1" }, "getKey"],
      ["/admin/v1/accounts/acme", { accountId: "acme" }, "getAccount"],
      ["/admin/v1/accounts/acme/connections", { accountId: "acme" }, "getAccount"],
      ["/admin/v1/accounts/acme/connections/main", { accountId: "acme" }, "getConnection"],
      ["/admin/v1/accounts/acme/keys", { accountId: "acme" }, "listKeys"],
    ] as const;
    for (const [url, of, rpc] of reads) {
      f.calls.length = 0;
      const res = await app.inject({ method: "GET", url, headers: auth });
      expect(res.statusCode).toBe(200);
      expect(f.calls.map((c) => c.rpc)).toEqual(["returnIdleOf", rpc]);
      expect(f.calls[0]!.req).toEqual(of);
    }
    // Changes, and metering's usage records (which no lease changes), return nothing.
    f.calls.length = 0;
    expect(
      (await app.inject({ method: "POST", url: "/admin/v1/keys/key_1/revoke", headers: auth })).statusCode,
    ).toBe(200);
    expect(
      (await app.inject({ method: "GET", url: "/admin/v1/usage?account=acme", headers: auth })).statusCode,
    ).toBe(200);
    expect((await app.inject({ method: "GET", url: "/admin/v1/accounts", headers: auth })).statusCode).toBe(
      200,
    );
    expect(f.calls.map((c) => c.rpc)).toEqual(["revokeKey", "stopLeasing", "getUsage", "listAccounts"]);
  });

  it("stop at once for the keys a change names, once auth-policy has made it", async () => {
    setup({ leases: true });
    const changes = [
      ["POST", "/admin/v1/keys/key_1/revoke", undefined, "revokeKey", { keyId: "key_1" }],
      ["POST", "/admin/v1/keys/key_1/rotate", {}, "rotateKey", { keyId: "key_1" }],
      ["PATCH", "/admin/v1/keys/key_1", { budget: null }, "updateKey", { keyId: "key_1" }],
      [
        "PATCH",
        "/admin/v1/accounts/acme",
        { limits: { requests_per_minute: 7 } },
        "updateAccount",
        { accountId: "acme" },
      ],
      ["DELETE", "/admin/v1/accounts/acme", undefined, "deleteAccount", { accountId: "acme" }],
      [
        "PATCH",
        "/admin/v1/accounts/acme/connections/main",
        { budget: { amount: "123", period: "day" } },
        "updateConnection",
        { accountId: "acme", connectionId: "main" },
      ],
      [
        "DELETE",
        "/admin/v1/accounts/acme/connections/main",
        undefined,
        "deleteConnection",
        { accountId: "acme", connectionId: "main" },
      ],
    ] as const;
    for (const [method, url, body, rpc, of] of changes) {
      f.calls.length = 0;
      const res = await app.inject({ method, url, ...(body ? json(body) : { headers: auth }) });
      expect(res.statusCode, `${method} ${url}: ${res.body}`).toBeLessThan(300);
      expect(f.calls.map((c) => c.rpc)).toEqual([rpc, "stopLeasing"]);
      expect(f.calls[1]!.req).toEqual(of);
    }
  });
});

describe("admin API: errors", () => {
  it.each([
    ["/admin/v1/accounts", { id: "acme", extra: 1 }, "extra"],
    ["/admin/v1/accounts", { limits: {} }, "id"],
    ["/admin/v1/accounts/acme/connections", { id: "c", models: [] }, "models"],
    ["/admin/v1/accounts/acme/connections", { id: "c", models: ["a"], routes: ["nope"] }, "routes"],
    ["/admin/v1/accounts/acme/connections/c/keys", { expires_at: "tomorrow" }, "expires_at"],
    ["/admin/v1/keys/k/rotate", { grace_seconds: -1 }, "grace_seconds"],
    ["/admin/v1/keys/k/rotate", { grace_seconds: 31 * 24 * 3600 }, "grace_seconds"],
  ])("POST %s %j → 400 naming the field", async (url, body, field) => {
    setup();
    const res = await app.inject({ method: "POST", url, ...json(body) });
    expect(res.statusCode).toBe(400);
    expect(res.json().error).toMatchObject({ type: "invalid_request_error", code: "invalid_request" });
    expect(res.json().error.message).toContain(field);
    expect(f.calls).toEqual([]);
  });

  it.each([
    "/admin/v1/usage?granularity=week",
    "/admin/v1/usage?from=yesterday",
    "/admin/v1/usage?from=2030-02-31",
    "/admin/v1/usage?accountId=acme",
    "/admin/v1/accounts/acme/keys?conn=main",
  ])("GET %s → 400", async (url) => {
    setup();
    const res = await app.inject({ method: "GET", url, headers: auth });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe("invalid_request");
    expect(f.calls).toEqual([]);
  });

  it.each(["/admin/v1/usage?from=2030-01-02&to=2030-01-01", "/admin/v1/usage?from=2030-01-01&to=2030-01-01"])(
    "GET %s → 400 invalid_time_range, as metering answers an empty range",
    async (url) => {
      setup();
      const res = await app.inject({ method: "GET", url, headers: auth });
      expect(res.statusCode).toBe(400);
      expect(res.json().error).toMatchObject({
        type: "invalid_request_error",
        code: "invalid_time_range",
        message: "from must be before to",
      });
      expect(f.calls).toEqual([]);
    },
  );

  it("answers bad JSON with 400 and another content type with 415", async () => {
    setup();
    const bad = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts",
      headers: { ...auth, "content-type": "application/json" },
      payload: "{",
    });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.code).toBe("invalid_json");
    const text = await app.inject({
      method: "POST",
      url: "/admin/v1/accounts",
      headers: { ...auth, "content-type": "text/plain" },
      payload: "acme",
    });
    expect(text.statusCode).toBe(415);
  });

  it.each([
    [GrpcStatus.INVALID_ARGUMENT, "invalid_argument", 400, "invalid_request_error"],
    [GrpcStatus.NOT_FOUND, "account_not_found", 404, "not_found_error"],
    [GrpcStatus.NOT_FOUND, "connection_not_found", 404, "not_found_error"],
    [GrpcStatus.NOT_FOUND, "key_not_found", 404, "not_found_error"],
    [GrpcStatus.ALREADY_EXISTS, "account_exists", 409, "conflict_error"],
    [GrpcStatus.ALREADY_EXISTS, "connection_exists", 409, "conflict_error"],
    [GrpcStatus.FAILED_PRECONDITION, "key_not_active", 409, "conflict_error"],
    [GrpcStatus.FAILED_PRECONDITION, "budget_period_change", 409, "conflict_error"],
    [GrpcStatus.UNAVAILABLE, "broadcast_failed", 503, "server_error"],
    [GrpcStatus.INVALID_ARGUMENT, "time_range_too_large", 400, "invalid_request_error"],
  ])("a remote %s %s becomes %s with the remote message", async (status, code, http, type) => {
    setup();
    f.failWith(new RemoteError(status, code, `remote says ${code}`));
    const res = await app.inject({ method: "POST", url: "/admin/v1/keys/k/revoke", headers: auth });
    expect(res.statusCode).toBe(http);
    expect(res.json().error).toMatchObject({ code, type, message: `remote says ${code}` });
  });

  it("hides the cause of an unknown failure and of an unreachable service", async () => {
    setup();
    f.failWith(new RemoteError(GrpcStatus.INTERNAL, "internal", "stack trace with /etc/secret"));
    const internal = await app.inject({ method: "GET", url: "/admin/v1/accounts/a/keys", headers: auth });
    expect(internal.statusCode).toBe(500);
    expect(internal.body).not.toContain("/etc/secret");
    f.failWith(new RemoteError(GrpcStatus.UNAVAILABLE, undefined, "connect ECONNREFUSED 10.0.0.1:50051"));
    const down = await app.inject({ method: "GET", url: "/admin/v1/accounts/a/keys", headers: auth });
    expect(down.statusCode).toBe(503);
    expect(down.json().error.code).toBe("service_unavailable");
    expect(down.body).not.toContain("10.0.0.1");
  });
});
