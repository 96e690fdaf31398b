import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { formatCost, SECRET_WARNING } from "./format.js";
import { run } from "./run.js";

const TOKEN = "admin-token-0123456789abcdef";
const SECRET = "tg_0123456789abcdefghijABCDEFGHIJ0123456789";
const key = {
  id: "key_1",
  object: "key",
  account_id: "acme",
  connection_id: "main",
  name: "",
  state: "active",
  last4: "6789",
  created_at: "2030-01-01T00:00:00.000Z",
  expires_at: null,
  revoked_at: null,
  rotated_from: null,
  rotated_to: null,
  grace_ends_at: null,
};

/** A fake admin API: records what was sent, answers with `status` and `body`. */
function fakeApi(status: number, body: unknown) {
  const sent: { url: string; init: RequestInit }[] = [];
  const fetchImpl = (async (url: string, init: RequestInit) => {
    sent.push({ url, init });
    return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
  }) as unknown as typeof fetch;
  return { sent, fetchImpl };
}

async function tollgatectl(argv: string[], api: ReturnType<typeof fakeApi>, env: NodeJS.ProcessEnv = {}) {
  let out = "";
  let err = "";
  const code = await run(
    argv,
    { TOLLGATE_ADMIN_TOKEN: TOKEN, ...env },
    { out: (t) => (out += t), err: (t) => (err += t) },
    api.fetchImpl,
  );
  return { code, out, err };
}

describe("tollgatectl run", () => {
  it("shows accounts, connections with their budget, a key, and what a delete revoked", async () => {
    const connection = {
      id: "main",
      object: "connection",
      account_id: "acme",
      models: ["m"],
      default_model: "m",
      default_max_output_tokens: 1024,
      max_output_tokens: 4096,
      routes: null,
      limits: {
        requests_per_minute: null,
        tokens_per_minute: null,
        key_requests_per_minute: null,
        key_tokens_per_minute: null,
        routes: {},
      },
      budget: { amount: "2500000", period_days: 7 },
      created_at: "2030-01-01T00:00:00.000Z",
    };
    const account = {
      id: "acme",
      object: "account",
      limits: { requests_per_minute: 5, tokens_per_minute: null },
      created_at: "2030-01-01T00:00:00.000Z",
    };
    const list = await tollgatectl(["accounts", "list"], fakeApi(200, { object: "list", data: [account] }));
    expect(list.out).toMatch(/acme\s+2030-01-01T00:00:00Z\s+5 requests\/min/);
    const shown = await tollgatectl(
      ["accounts", "show", "acme"],
      fakeApi(200, { ...account, connections: [connection] }),
    );
    expect(shown.out).toContain("2500000/7d");
    const conn = await tollgatectl(["connections", "show", "acme", "main"], fakeApi(200, connection));
    expect(conn.out).toContain("budget:     2.500000 USD (2500000 base units) per 7 days");
    const k = await tollgatectl(["keys", "show", "key_1"], fakeApi(200, key));
    expect(k.out).toContain("budget:  none");
    expect(k.out).not.toContain("this period");
    const spent = await tollgatectl(
      ["keys", "show", "key_1"],
      fakeApi(200, {
        ...key,
        budget: { amount: "1000", period: "week" },
        budget_usage: {
          spent: "150",
          held: "300",
          remaining: "550",
          period_start: "2030-01-07T00:00:00.000Z",
          period_end: "2030-01-14T00:00:00.000Z",
        },
      }),
    );
    expect(spent.out).toContain(
      "this period: 150 spent, 300 held by running requests, 550 left (base units) from 2030-01-07 to 2030-01-14 (UTC)",
    );
    const deleted = await tollgatectl(
      ["connections", "delete", "acme", "main"],
      fakeApi(200, {
        id: "main",
        object: "connection",
        account_id: "acme",
        deleted: true,
        revoked_keys: [key],
      }),
    );
    expect(deleted.out).toBe("deleted connection acme/main; revoked 1 key: key_1\n");
  });

  it("shows a key's and a connection's budget in USD and base units", async () => {
    const budgeted = { ...key, budget: { amount: "5000000", period: "week" } };
    const created = await tollgatectl(
      ["keys", "create", "acme", "main", "--budget", "5000000"],
      fakeApi(201, {
        key: budgeted,
        secret: SECRET,
      }),
    );
    expect(created.out).toContain("budget 5.000000 USD (5000000 base units) per week");
    const listed = await tollgatectl(
      ["keys", "list", "acme"],
      fakeApi(200, { object: "list", data: [budgeted] }),
    );
    expect(listed.out).toMatch(/BUDGET/);
    expect(listed.out).toContain("5000000/week");
  });

  it("sends the token to TOLLGATE_ADMIN_URL and prints a created key's secret once, warning on stderr", async () => {
    const api = fakeApi(201, { key, secret: SECRET });
    const r = await tollgatectl(["keys", "create", "acme", "main"], api, {
      TOLLGATE_ADMIN_URL: "http://h:9/",
    });
    expect(r.code).toBe(0);
    expect(api.sent[0]?.url).toBe("http://h:9/admin/v1/accounts/acme/connections/main/keys");
    expect((api.sent[0]!.init.headers as Record<string, string>).authorization).toBe(`Bearer ${TOKEN}`);
    expect(r.out.split(SECRET)).toHaveLength(2);
    expect(r.err).toContain(SECRET_WARNING);
    expect(r.out + r.err).not.toContain(TOKEN);
  });

  it("defaults to http://127.0.0.1:8081 and reads the token from --token-file", async () => {
    const dir = mkdtempSync(join(tmpdir(), "tollgatectl-"));
    writeFileSync(join(dir, "token"), `${TOKEN}\n`);
    const api = fakeApi(200, { object: "list", data: [key] });
    const r = await tollgatectl(["keys", "list", "acme", "--token-file", join(dir, "token")], api, {
      TOLLGATE_ADMIN_TOKEN: "",
    });
    expect(r.code).toBe(0);
    expect(api.sent[0]?.url).toBe("http://127.0.0.1:8081/admin/v1/accounts/acme/keys");
    expect((api.sent[0]!.init.headers as Record<string, string>).authorization).toBe(`Bearer ${TOKEN}`);
    expect(r.out).toMatch(/^ID\s+CONNECTION\s+NAME\s+STATE/);
    expect(r.out).toContain("key_1");
  });

  it("prints the API's JSON with --json", async () => {
    const api = fakeApi(200, { key: { ...key, state: "revoked" } });
    const r = await tollgatectl(["keys", "revoke", "key_1", "--json"], api);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual({ key: { ...key, state: "revoked" } });
    expect(api.sent[0]?.init.method).toBe("POST");
    expect(api.sent[0]?.init.body).toBeUndefined();
  });

  it("exits 1 with the API's message when the API refuses", async () => {
    const api = fakeApi(404, {
      error: { message: "no key 'nope'", type: "not_found_error", code: "key_not_found" },
    });
    const r = await tollgatectl(["keys", "revoke", "nope"], api);
    expect(r.code).toBe(1);
    expect(r.err).toBe("tollgatectl: no key 'nope' (key_not_found, HTTP 404)\n");
    expect(r.out).toBe("");
  });

  it("shows the refusal of a budget period changed in place, and what was asked", async () => {
    const message =
      "the connection's budget counts per 'day' period; giving it a 'month' period would count the new period from zero";
    const api = fakeApi(409, { error: { message, type: "conflict_error", code: "budget_period_change" } });
    const r = await tollgatectl(["connections", "update", "sw1", "c2", "--budget", "300"], api);
    expect(r.code).toBe(1);
    expect(r.err).toBe(`tollgatectl: ${message} (budget_period_change, HTTP 409)\n`);
    expect(r.out).toBe("");
    expect(api.sent[0]?.init.method).toBe("PATCH");
    expect(JSON.parse(api.sent[0]?.init.body as string)).toEqual({
      budget: { amount: "300", period: "month" },
    });
  });

  it("exits 1 when the API cannot be reached", async () => {
    let err = "";
    // The real fetch, against a port nothing listens on.
    const code = await run(
      ["keys", "list", "acme"],
      { TOLLGATE_ADMIN_TOKEN: TOKEN, TOLLGATE_ADMIN_URL: "http://127.0.0.1:1" },
      { out: () => {}, err: (t) => (err += t) },
    );
    expect(code).toBe(1);
    expect(err).toContain("cannot reach the admin API at http://127.0.0.1:1");
  });

  it("exits 2 on a bad command line, without a token and with a bad URL, sending nothing", async () => {
    const api = fakeApi(200, {});
    const bad = await tollgatectl(["keys", "rotate", "k", "--grace", "soon"], api);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("--grace");
    expect(bad.err).toContain("tollgatectl --help");
    const noToken = await tollgatectl(["keys", "list", "acme"], api, { TOLLGATE_ADMIN_TOKEN: "" });
    expect(noToken.code).toBe(2);
    expect(noToken.err).toContain("TOLLGATE_ADMIN_TOKEN");
    const badUrl = await tollgatectl(["keys", "list", "acme", "--url", "ftp://x"], api);
    expect(badUrl.code).toBe(2);
    expect(api.sent).toEqual([]);
  });

  it("help goes to stdout with exit 0", async () => {
    const r = await tollgatectl(["--help"], fakeApi(200, {}));
    expect(r.code).toBe(0);
    expect(r.out).toContain("keys rotate <keyId>");
  });

  it("shows usage as a table with exact spend", async () => {
    const totals = { requests: 2, input_tokens: 20, output_tokens: 6, reasoning_tokens: 0, cost: "1234567" };
    const api = fakeApi(200, {
      object: "usage",
      granularity: "hour",
      totals,
      buckets: [{ start: "2030-01-01T10:00:00.000Z", ...totals }],
    });
    const r = await tollgatectl(["usage", "--account", "acme"], api);
    expect(r.code).toBe(0);
    const lines = r.out.trimEnd().split("\n");
    expect(lines[0]).toMatch(
      /^HOUR \(UTC\)\s+REQUESTS\s+INPUT\s+OUTPUT\s+REASONING\s+SPEND \(base units\)\s+SPEND \(USD\)$/,
    );
    expect(lines[1]).toMatch(/^2030-01-01T10:00:00Z\s+2\s+20\s+6\s+0\s+1234567\s+1\.234567$/);
    expect(lines[2]).toMatch(/^TOTAL\s+2\s+20\s+6\s+0\s+1234567\s+1\.234567$/);
  });

  it("shows usage by day and model, one row per model and day", async () => {
    const mini = { requests: 2, input_tokens: 20, output_tokens: 6, reasoning_tokens: 0, cost: "1200" };
    const large = { requests: 1, input_tokens: 10, output_tokens: 3, reasoning_tokens: 0, cost: "34" };
    const api = fakeApi(200, {
      object: "usage",
      granularity: "day",
      group_by: "model",
      totals: { requests: 3, input_tokens: 30, output_tokens: 9, reasoning_tokens: 0, cost: "1234" },
      buckets: [
        { start: "2030-01-01T00:00:00.000Z", model: "tollgate-large", ...large },
        { start: "2030-01-01T00:00:00.000Z", model: "tollgate-mini", ...mini },
      ],
    });
    const r = await tollgatectl(["usage", "--by", "day,model"], api);
    expect(r.code).toBe(0);
    const lines = r.out.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^DAY \(UTC\)\s+MODEL\s+REQUESTS\s+INPUT/);
    expect(lines[1]).toMatch(/^2030-01-01\S*\s+tollgate-large\s+1\s+10\s+3\s+0\s+34\s+0\.000034$/);
    expect(lines[2]).toMatch(/^2030-01-01\S*\s+tollgate-mini\s+2\s+20\s+6\s+0\s+1200\s+0\.001200$/);
    expect(lines[3]).toMatch(/^TOTAL\s+3\s+30\s+9\s+0\s+1234\s+0\.001234$/);
  });
});

describe("formatCost", () => {
  it.each([
    ["0", "0.000000"],
    ["1", "0.000001"],
    ["1234", "0.001234"],
    ["1000000", "1.000000"],
    ["123456789012345678901", "123456789012345.678901"],
  ])("%s base units are %s", (base, units) => {
    expect(formatCost(base)).toBe(units);
  });
});
