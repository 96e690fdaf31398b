import { describe, expect, it } from "vitest";
import { type Invocation, parseCommandLine, parseDuration, parseTime, UsageError } from "./args.js";

const request = (argv: string[]) => {
  const inv = parseCommandLine(argv);
  if (inv.kind !== "call") throw new Error("expected a call");
  return inv.request;
};
const usageError = (argv: string[]) => {
  try {
    parseCommandLine(argv);
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    return (err as Error).message;
  }
  throw new Error(`'${argv.join(" ")}' parsed`);
};

describe("tollgatectl command lines", () => {
  it("accounts create, with and without limits", () => {
    expect(request(["accounts", "create", "acme"])).toEqual({
      method: "POST",
      path: "/admin/v1/accounts",
      body: { id: "acme" },
    });
    expect(request(["accounts", "create", "acme", "--rpm", "600", "--tpm", "2000000"]).body).toEqual({
      id: "acme",
      limits: { requests_per_minute: 600, tokens_per_minute: 2000000 },
    });
  });

  it("connections create with every option", () => {
    expect(
      request([
        "connections",
        "create",
        "acme",
        "main",
        "--models",
        "a, b",
        "--default",
        "b",
        "--default-max-output",
        "100",
        "--max-output",
        "200",
        "--routes",
        "chat,think",
        "--rpm",
        "10",
        "--tpm",
        "1000",
        "--key-rpm",
        "5",
        "--key-tpm",
        "500",
        "--route-rpm",
        "think=2",
        "--route-rpm",
        "chat=3",
        "--route-tpm",
        "think=20",
      ]),
    ).toEqual({
      method: "POST",
      path: "/admin/v1/accounts/acme/connections",
      body: {
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
          key_tokens_per_minute: 500,
          routes: {
            think: { requests_per_minute: 2, tokens_per_minute: 20 },
            chat: { requests_per_minute: 3 },
          },
        },
      },
    });
    expect(request(["connections", "create", "acme", "main", "--models", "a"]).body).toEqual({
      id: "main",
      models: ["a"],
    });
  });

  it("sets budgets on connections and keys, in base units as strings", () => {
    expect(
      request(["connections", "create", "acme", "main", "--models", "m", "--budget", "9007199254740991"])
        .body,
    ).toEqual({ id: "main", models: ["m"], budget: { amount: "9007199254740991", period: "month" } });
    expect(
      request(["keys", "create", "acme", "main", "--budget", "5000000", "--budget-period", "week"]).body,
    ).toEqual({ budget: { amount: "5000000", period: "week" } });
    expect(
      request(["keys", "create", "acme", "main", "--budget", "1", "--budget-period", "30d"]).body,
    ).toEqual({ budget: { amount: "1", period_days: 30 } });
    expect(usageError(["keys", "create", "a", "c", "--budget", "1.5"])).toMatch(/whole number of base units/);
    expect(usageError(["keys", "create", "a", "c", "--budget", "9007199254740992"])).toMatch(/at most/);
    expect(usageError(["keys", "create", "a", "c", "--budget", "1", "--budget-period", "0d"])).toMatch(
      /month, week, day or 1d to 366d/,
    );
    expect(usageError(["keys", "create", "a", "c", "--budget-period", "day"])).toMatch(/needs --budget/);
  });

  it("lists, shows, updates and deletes accounts, connections and keys", () => {
    expect(request(["accounts", "list"])).toEqual({ method: "GET", path: "/admin/v1/accounts" });
    expect(request(["accounts", "show", "a/b"])).toEqual({ method: "GET", path: "/admin/v1/accounts/a%2Fb" });
    expect(request(["accounts", "update", "acme", "--rpm", "5"])).toEqual({
      method: "PATCH",
      path: "/admin/v1/accounts/acme",
      body: { limits: { requests_per_minute: 5 } },
    });
    expect(request(["accounts", "delete", "acme"])).toEqual({
      method: "DELETE",
      path: "/admin/v1/accounts/acme",
    });
    expect(request(["connections", "list", "acme"])).toEqual({
      method: "GET",
      path: "/admin/v1/accounts/acme/connections",
    });
    expect(request(["connections", "show", "acme", "main"])).toEqual({
      method: "GET",
      path: "/admin/v1/accounts/acme/connections/main",
    });
    expect(
      request(["connections", "update", "acme", "main", "--budget", "10", "--budget-period", "day"]),
    ).toEqual({
      method: "PATCH",
      path: "/admin/v1/accounts/acme/connections/main",
      body: { budget: { amount: "10", period: "day" } },
    });
    expect(request(["connections", "update", "acme", "main", "--no-budget", "--key-rpm", "3"]).body).toEqual({
      budget: null,
      limits: { key_requests_per_minute: 3 },
    });
    expect(request(["connections", "delete", "acme", "main"])).toEqual({
      method: "DELETE",
      path: "/admin/v1/accounts/acme/connections/main",
    });
    expect(request(["keys", "show", "key_1"])).toEqual({ method: "GET", path: "/admin/v1/keys/key_1" });
    expect(request(["keys", "update", "key_1", "--budget", "7"])).toEqual({
      method: "PATCH",
      path: "/admin/v1/keys/key_1",
      body: { budget: { amount: "7", period: "month" } },
    });
    expect(request(["keys", "update", "key_1", "--no-budget"]).body).toEqual({ budget: null });
    expect(usageError(["keys", "update", "key_1"])).toMatch(/needs --budget or --no-budget/);
    expect(usageError(["keys", "update", "key_1", "--budget", "1", "--no-budget"])).toMatch(/not both/);
    expect(usageError(["connections", "update", "acme", "main"])).toMatch(/needs --budget/);
    expect(usageError(["accounts", "show"])).toMatch(/takes <account>/);
  });

  it("keys create, list, revoke and rotate; path segments are encoded", () => {
    expect(
      request([
        "keys",
        "create",
        "acme",
        "main",
        "--name",
        "ci bot",
        "--expires",
        "2030-01-31T12:00:00+01:00",
      ]),
    ).toEqual({
      method: "POST",
      path: "/admin/v1/accounts/acme/connections/main/keys",
      body: { name: "ci bot", expires_at: "2030-01-31T11:00:00.000Z" },
    });
    expect(request(["keys", "create", "a/b", "c?d"]).path).toBe(
      "/admin/v1/accounts/a%2Fb/connections/c%3Fd/keys",
    );
    expect(request(["keys", "list", "acme"])).toEqual({
      method: "GET",
      path: "/admin/v1/accounts/acme/keys",
    });
    expect(request(["keys", "list", "acme", "--connection", "main"]).path).toBe(
      "/admin/v1/accounts/acme/keys?connection=main",
    );
    expect(request(["keys", "revoke", "key_1"])).toEqual({
      method: "POST",
      path: "/admin/v1/keys/key_1/revoke",
    });
    expect(request(["keys", "rotate", "key_1"])).toEqual({
      method: "POST",
      path: "/admin/v1/keys/key_1/rotate",
      body: {},
    });
    expect(request(["keys", "rotate", "key_1", "--grace", "24h", "--expires", "2031-01-01"]).body).toEqual({
      grace_seconds: 86_400,
      expires_at: "2031-01-01T00:00:00.000Z",
    });
    expect(request(["keys", "rotate", "key_1", "--grace", "0"]).body).toEqual({ grace_seconds: 0 });
  });

  it("usage by day and model", () => {
    const url = new URL(request(["usage", "--by", "day,model"]).path, "http://x");
    expect(Object.fromEntries(url.searchParams)).toEqual({ granularity: "day", group_by: "model" });
    const byModel = new URL(request(["usage", "--by", "model"]).path, "http://x");
    expect(Object.fromEntries(byModel.searchParams)).toEqual({ group_by: "model" });
  });

  it("usage with filters, range and granularity", () => {
    expect(request(["usage"])).toEqual({ method: "GET", path: "/admin/v1/usage" });
    const r = request([
      "usage",
      "--account",
      "acme",
      "--connection",
      "main",
      "--key",
      "key_1",
      "--model",
      "tollgate-mini",
      "--from",
      "2030-01-01",
      "--to",
      "2030-01-02T00:00:00Z",
      "--by",
      "day",
    ]);
    const url = new URL(r.path, "http://x");
    expect(url.pathname).toBe("/admin/v1/usage");
    expect(Object.fromEntries(url.searchParams)).toEqual({
      account: "acme",
      connection: "main",
      key: "key_1",
      model: "tollgate-mini",
      from: "2030-01-01T00:00:00.000Z",
      to: "2030-01-02T00:00:00.000Z",
      granularity: "day",
    });
  });

  it("global options anywhere on the line", () => {
    const inv = parseCommandLine([
      "--url",
      "http://h:1",
      "keys",
      "list",
      "acme",
      "--json",
      "--token-file",
      "/t",
    ]);
    expect(inv).toEqual({
      kind: "call",
      request: { method: "GET", path: "/admin/v1/accounts/acme/keys" },
      view: "key-list",
      json: true,
      url: "http://h:1",
      tokenFile: "/t",
    } satisfies Invocation);
    expect(parseCommandLine(["--help"])).toEqual({ kind: "help" });
    expect(parseCommandLine(["keys", "list", "-h"])).toEqual({ kind: "help" });
    expect(parseCommandLine(["help"])).toEqual({ kind: "help" });
  });

  it.each([
    [[], "no command"],
    [["keys"], "unknown command 'keys'"],
    [["keys", "delete", "k"], "unknown command 'keys delete'"],
    [["accounts", "create"], "<account>"],
    [["accounts", "create", "a", "b"], "<account>"],
    [["keys", "revoke", "k", "--grace", "1h"], "does not take --grace"],
    [["keys", "list", "a", "--bogus"], "bogus"],
    [["connections", "create", "a", "c"], "--models"],
    [["connections", "create", "a", "c", "--models", ","], "at least one model"],
    [["connections", "create", "a", "c", "--models", "m", "--rpm", "0"], "--rpm"],
    [["connections", "create", "a", "c", "--models", "m", "--rpm", "1.5"], "--rpm"],
    [["connections", "create", "a", "c", "--models", "m", "--routes", "chat,nope"], "unknown route 'nope'"],
    [["connections", "create", "a", "c", "--models", "m", "--route-rpm", "think"], "route=N"],
    [["keys", "create", "a", "c", "--expires", "next week"], "--expires"],
    [["keys", "create", "a", "c", "--expires", "2030-01-01T10:00"], "--expires"],
    [["keys", "rotate", "k", "--grace", "1 day"], "--grace"],
    [["keys", "rotate", "k", "--grace", "-1"], "grace"],
    [["usage", "--by", "week"], "--by"],
    [["usage", "--by", "day,hour"], "--by"],
    [["usage", "--by", "day,modle"], "--by"],
    [["usage", "extra"], "no arguments"],
    [["keys", "revoke", ""], "must not be empty"],
  ])("%j is a usage error (%s)", (argv, fragment) => {
    expect(usageError(argv)).toContain(fragment);
  });
});

describe("durations and times", () => {
  it.each([
    ["0", 0],
    ["3600", 3600],
    ["90s", 90],
    ["15m", 900],
    ["24h", 86_400],
    ["7d", 604_800],
    ["1h30m", 5_400],
  ])("%s is %i seconds", (text, seconds) => {
    expect(parseDuration(text)).toBe(seconds);
  });

  it("times must be ISO 8601 with a zone, or a date", () => {
    expect(parseTime("2030-01-31", "--from")).toBe("2030-01-31T00:00:00.000Z");
    expect(parseTime("2030-01-31T12:00Z", "--from")).toBe("2030-01-31T12:00:00.000Z");
    expect(() => parseTime("2030-02-31T00:00:00Z", "--from")).toThrow(UsageError);
    expect(() => parseTime("1700000000", "--from")).toThrow(UsageError);
  });
});
