// Command-line parsing for tollgatectl: argv → one admin API request and how to show its answer.
// Pure (no network, no process state), so every rule here is unit-tested.

import { parseArgs } from "node:util";
import { OPERATION_NAMES } from "@tollgate/proto/routes";

/** A command line that cannot be run as given (exit code 2). */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/** How the answer of a request is shown. */
export type View =
  | "account"
  | "account-list"
  | "account-show"
  | "account-updated"
  | "connection"
  | "connection-list"
  | "connection-show"
  | "connection-updated"
  | "deleted"
  | "key-show"
  | "key-updated"
  | "key-created"
  | "key-list"
  | "key-revoked"
  | "key-rotated"
  | "usage";

/** One call of the admin API. */
export interface AdminRequest {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  /** Path and query, already encoded, e.g. `/admin/v1/accounts/acme/keys?connection=main`. */
  path: string;
  body?: Record<string, unknown>;
}

/** A parsed command line. */
export type Invocation =
  | { kind: "help" }
  | {
      kind: "call";
      request: AdminRequest;
      view: View;
      /** Print the API's JSON answer instead of the readable view. */
      json: boolean;
      /** --url, overriding TOLLGATE_ADMIN_URL. */
      url?: string;
      /** --token-file, instead of TOLLGATE_ADMIN_TOKEN. */
      tokenFile?: string;
    };

export const USAGE = `Usage: tollgatectl <command> [options]

Commands:
  accounts create <account> [--rpm N] [--tpm N]
  accounts list
  accounts show <account>
  accounts update <account> [--rpm N] [--tpm N]      (replaces the account's limits)
  accounts delete <account>                          (revokes every key of the account)
  connections create <account> <connection> --models a,b [--default m]
        [--default-max-output N] [--max-output N] [--routes chat,think,...]
        [--rpm N] [--tpm N] [--key-rpm N] [--key-tpm N]
        [--route-rpm route=N ...] [--route-tpm route=N ...]
        [--budget BASE_UNITS [--budget-period month|week|day|Nd]]
  connections list <account>
  connections show <account> <connection>
  connections update <account> <connection>
        [--budget BASE_UNITS [--budget-period month|week|day|Nd] | --no-budget]
        [--rpm N] [--tpm N] [--key-rpm N] [--key-tpm N] [--route-rpm route=N ...] [--route-tpm route=N ...]
        (any limit option replaces all of the connection's limits)
  connections delete <account> <connection>          (revokes every key of the connection)
  keys create <account> <connection> [--expires ISO] [--name text]
        [--budget BASE_UNITS [--budget-period month|week|day|Nd]]
  keys list <account> [--connection c]
  keys show <keyId>
  keys update <keyId> --budget BASE_UNITS [--budget-period month|week|day|Nd] | --no-budget
  keys revoke <keyId>
  keys rotate <keyId> [--grace 24h|90m|3600] [--expires ISO]
  usage [--account a] [--connection c] [--key k] [--model m]
        [--from ISO] [--to ISO] [--by hour|day|model|day,model|hour,model]

Options:
  --json               print the admin API's JSON answer
  --url <base>         admin API base URL (env TOLLGATE_ADMIN_URL; default http://127.0.0.1:8081)
  --token-file <path>  read the admin token from a file (else env TOLLGATE_ADMIN_TOKEN)
  -h, --help           show this help

--rpm/--tpm are requests/tokens per minute: of the account (accounts create), of all keys of the
connection together (connections create); --key-rpm/--key-tpm limit each key, --route-rpm and
--route-tpm one route of the connection. Times are ISO 8601 (2030-01-31 or
2030-01-31T12:00:00Z). Spend is in base units of the payment token (6 decimals).
--budget caps the spend of all keys of a connection together, or of one key, per period (UTC;
default month): 5000000 is 5 USD. An update must name the budget's own period: a change of
period is refused (409 budget_period_change); --no-budget, then the new budget, starts afresh.

Exit codes: 0 done, 1 the admin API refused or could not be reached, 2 bad command line.`;

const OPTIONS = {
  help: { type: "boolean", short: "h" },
  json: { type: "boolean" },
  url: { type: "string" },
  "token-file": { type: "string" },
  rpm: { type: "string" },
  tpm: { type: "string" },
  "key-rpm": { type: "string" },
  "key-tpm": { type: "string" },
  "route-rpm": { type: "string", multiple: true },
  "route-tpm": { type: "string", multiple: true },
  models: { type: "string" },
  default: { type: "string" },
  "default-max-output": { type: "string" },
  "max-output": { type: "string" },
  routes: { type: "string" },
  expires: { type: "string" },
  name: { type: "string" },
  connection: { type: "string" },
  grace: { type: "string" },
  account: { type: "string" },
  key: { type: "string" },
  model: { type: "string" },
  from: { type: "string" },
  to: { type: "string" },
  by: { type: "string" },
  budget: { type: "string" },
  "budget-period": { type: "string" },
  "no-budget": { type: "boolean" },
} as const;

type OptionName = keyof typeof OPTIONS;
type Values = ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>["values"];

const GLOBAL: readonly OptionName[] = ["help", "json", "url", "token-file"];

/** Options each command takes, on top of the global ones. */
const COMMAND_OPTIONS: Record<string, readonly OptionName[]> = {
  "accounts create": ["rpm", "tpm"],
  "connections create": [
    "models",
    "default",
    "default-max-output",
    "max-output",
    "routes",
    "rpm",
    "tpm",
    "key-rpm",
    "key-tpm",
    "route-rpm",
    "route-tpm",
    "budget",
    "budget-period",
  ],
  "keys create": ["expires", "name", "budget", "budget-period"],
  "accounts list": [],
  "accounts show": [],
  "accounts update": ["rpm", "tpm"],
  "accounts delete": [],
  "connections list": [],
  "connections show": [],
  "connections update": [
    "budget",
    "budget-period",
    "no-budget",
    "rpm",
    "tpm",
    "key-rpm",
    "key-tpm",
    "route-rpm",
    "route-tpm",
  ],
  "connections delete": [],
  "keys show": [],
  "keys update": ["budget", "budget-period", "no-budget"],
  "keys list": ["connection"],
  "keys revoke": [],
  "keys rotate": ["grace", "expires"],
  usage: ["account", "connection", "key", "model", "from", "to", "by"],
};

/** The account-door routes a connection's policy and limits name. */
const ROUTES: readonly string[] = OPERATION_NAMES;
const ISO = /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2}))?$/;
const DURATION_UNIT: Record<string, number> = { s: 1, m: 60, h: 3_600, d: 86_400 };

/** Seconds of a duration: plain seconds (`3600`) or units (`90s`, `15m`, `24h`, `7d`, `1h30m`). */
export function parseDuration(value: string, option = "--grace"): number {
  if (/^\d+$/.test(value)) return Number(value);
  if (!/^(\d+[smhd])+$/.test(value)) {
    throw new UsageError(`${option} must be seconds (3600) or a duration like 90s, 15m, 24h, 7d or 1h30m`);
  }
  let seconds = 0;
  for (const [, n, unit] of value.matchAll(/(\d+)([smhd])/g)) seconds += Number(n) * DURATION_UNIT[unit!]!;
  return seconds;
}

/** True when YYYY-MM-DD at the start of `value` is a real calendar day (Date rolls 02-31 over). */
function realDay(value: string): boolean {
  const [y, m, d] = value.slice(0, 10).split("-").map(Number) as [number, number, number];
  const day = new Date(Date.UTC(y, m - 1, d));
  return day.getUTCFullYear() === y && day.getUTCMonth() === m - 1 && day.getUTCDate() === d;
}

/** An ISO 8601 time given on the command line, normalised to UTC. */
export function parseTime(value: string, option: string): string {
  const date = new Date(value);
  if (!ISO.test(value) || Number.isNaN(date.getTime()) || !realDay(value)) {
    throw new UsageError(`${option} must be an ISO 8601 time such as 2030-01-31 or 2030-01-31T12:00:00Z`);
  }
  return date.toISOString();
}

function positiveInt(value: string, option: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < 1) {
    throw new UsageError(`${option} must be a whole number of at least 1`);
  }
  return n;
}

function list(value: string): string[] {
  return value
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
}

function checkRoute(route: string, option: string): string {
  if (!ROUTES.includes(route))
    throw new UsageError(`${option}: unknown route '${route}' (one of ${ROUTES.join(", ")})`);
  return route;
}

/** `--route-rpm think=10 --route-rpm chat=100` or `--route-rpm think=10,chat=100`. */
function routeLimits(values: readonly string[] | undefined, option: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const entry of (values ?? []).flatMap(list)) {
    const [route, n, ...rest] = entry.split("=");
    if (route === undefined || n === undefined || rest.length > 0) {
      throw new UsageError(`${option} takes route=N, e.g. ${option} think=10`);
    }
    out.set(checkRoute(route, option), positiveInt(n, option));
  }
  return out;
}

/** The largest budget auth-policy takes, in base units. */
const MAX_BUDGET = 9_007_199_254_740_991n;

/**
 * `--budget <base units> [--budget-period month|week|day|<N>d]` as the admin API's budget body;
 * undefined without --budget. The amount stays a decimal string: money is never a float.
 */
export function budgetBody(values: Values): Record<string, unknown> | undefined {
  const amount = str(values, "budget");
  const period = str(values, "budget-period");
  if (amount === undefined) {
    if (period !== undefined) throw new UsageError("--budget-period needs --budget");
    return undefined;
  }
  if (!/^\d+$/.test(amount) || BigInt(amount) > MAX_BUDGET) {
    throw new UsageError(
      `--budget must be a whole number of base units (6 decimals: 1000000 = 1 USD), at most ${MAX_BUDGET}`,
    );
  }
  if (period === undefined || period === "month" || period === "week" || period === "day") {
    return { amount, period: period ?? "month" };
  }
  const days = /^(\d+)d$/.exec(period);
  const n = days ? Number(days[1]) : 0;
  if (n < 1 || n > 366) throw new UsageError("--budget-period must be month, week, day or 1d to 366d");
  return { amount, period_days: n };
}

/** The connection limit options as the admin API's `limits` body (empty when none is given). */
function connectionLimits(values: Values): Record<string, unknown> {
  const rpm = routeLimits(values["route-rpm"], "--route-rpm");
  const tpm = routeLimits(values["route-tpm"], "--route-tpm");
  const routeNames = [...new Set([...rpm.keys(), ...tpm.keys()])];
  return defined({
    requests_per_minute: int(values, "rpm"),
    tokens_per_minute: int(values, "tpm"),
    key_requests_per_minute: int(values, "key-rpm"),
    key_tokens_per_minute: int(values, "key-tpm"),
    ...(routeNames.length > 0
      ? {
          routes: Object.fromEntries(
            routeNames.map((r) => [
              r,
              defined({ requests_per_minute: rpm.get(r), tokens_per_minute: tpm.get(r) }),
            ]),
          ),
        }
      : {}),
  });
}

/** `--budget …` sets a budget, `--no-budget` clears it (null); neither: undefined. */
function budgetChange(values: Values): Record<string, unknown> | null | undefined {
  if (values["no-budget"]) {
    if (values.budget !== undefined || values["budget-period"] !== undefined) {
      throw new UsageError("give --budget or --no-budget, not both");
    }
    return null;
  }
  return budgetBody(values);
}

const seg = (s: string) => encodeURIComponent(s);

/** Drops undefined fields, so the body carries only what was given. */
function defined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}

function int(values: Values, name: OptionName): number | undefined {
  const v = values[name];
  return typeof v === "string" ? positiveInt(v, `--${name}`) : undefined;
}

function str(values: Values, name: OptionName): string | undefined {
  const v = values[name];
  if (typeof v !== "string") return undefined;
  if (v === "") throw new UsageError(`--${name} needs a value`);
  return v;
}

function positionals(args: string[], names: readonly string[], command: string): string[] {
  if (args.length !== names.length) {
    const expected = names.map((n) => `<${n}>`).join(" ");
    throw new UsageError(`'${command}' takes ${expected || "no arguments"}`);
  }
  for (const [i, a] of args.entries()) if (a === "") throw new UsageError(`<${names[i]}> must not be empty`);
  return args;
}

/** Turns a command line (without `node` and the script) into what to call and how to show it. */
export function parseCommandLine(argv: readonly string[]): Invocation {
  let parsed: { values: Values; positionals: string[] };
  try {
    parsed = parseArgs({ args: [...argv], options: OPTIONS, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values } = parsed;
  const words = parsed.positionals;
  if (values.help || words[0] === "help") return { kind: "help" };
  if (words.length === 0) throw new UsageError("no command given");

  const command = words[0] === "usage" ? "usage" : words.slice(0, 2).join(" ");
  const allowed = COMMAND_OPTIONS[command];
  if (!allowed) throw new UsageError(`unknown command '${command}'`);
  const rest = words.slice(command.split(" ").length);
  for (const name of Object.keys(values) as OptionName[]) {
    if (!GLOBAL.includes(name) && !allowed.includes(name)) {
      throw new UsageError(`'${command}' does not take --${name}`);
    }
  }

  const call = (request: AdminRequest, view: View): Invocation => ({
    kind: "call",
    request,
    view,
    json: values.json === true,
    ...(values.url !== undefined ? { url: values.url } : {}),
    ...(values["token-file"] !== undefined ? { tokenFile: values["token-file"] } : {}),
  });

  switch (command) {
    case "accounts create": {
      const [account] = positionals(rest, ["account"], command);
      const limits = defined({
        requests_per_minute: int(values, "rpm"),
        tokens_per_minute: int(values, "tpm"),
      });
      return call(
        {
          method: "POST",
          path: "/admin/v1/accounts",
          body: { id: account!, ...(Object.keys(limits).length > 0 ? { limits } : {}) },
        },
        "account",
      );
    }
    case "connections create": {
      const [account, connection] = positionals(rest, ["account", "connection"], command);
      const modelsArg = str(values, "models");
      if (modelsArg === undefined) throw new UsageError("'connections create' needs --models a,b");
      const models = list(modelsArg);
      if (models.length === 0) throw new UsageError("--models must name at least one model");
      const routesArg = str(values, "routes");
      const limits = connectionLimits(values);
      return call(
        {
          method: "POST",
          path: `/admin/v1/accounts/${seg(account!)}/connections`,
          body: defined({
            id: connection!,
            models,
            default_model: str(values, "default"),
            default_max_output_tokens: int(values, "default-max-output"),
            max_output_tokens: int(values, "max-output"),
            routes:
              routesArg === undefined ? undefined : list(routesArg).map((r) => checkRoute(r, "--routes")),
            limits: Object.keys(limits).length > 0 ? limits : undefined,
            budget: budgetBody(values),
          }),
        },
        "connection",
      );
    }
    case "keys create": {
      const [account, connection] = positionals(rest, ["account", "connection"], command);
      const expires = str(values, "expires");
      return call(
        {
          method: "POST",
          path: `/admin/v1/accounts/${seg(account!)}/connections/${seg(connection!)}/keys`,
          body: defined({
            name: values.name,
            expires_at: expires === undefined ? undefined : parseTime(expires, "--expires"),
            budget: budgetBody(values),
          }),
        },
        "key-created",
      );
    }
    case "accounts list":
      positionals(rest, [], command);
      return call({ method: "GET", path: "/admin/v1/accounts" }, "account-list");
    case "accounts show": {
      const [account] = positionals(rest, ["account"], command);
      return call({ method: "GET", path: `/admin/v1/accounts/${seg(account!)}` }, "account-show");
    }
    case "accounts update": {
      const [account] = positionals(rest, ["account"], command);
      const limits = defined({
        requests_per_minute: int(values, "rpm"),
        tokens_per_minute: int(values, "tpm"),
      });
      return call(
        { method: "PATCH", path: `/admin/v1/accounts/${seg(account!)}`, body: { limits } },
        "account-updated",
      );
    }
    case "accounts delete": {
      const [account] = positionals(rest, ["account"], command);
      return call({ method: "DELETE", path: `/admin/v1/accounts/${seg(account!)}` }, "deleted");
    }
    case "connections list": {
      const [account] = positionals(rest, ["account"], command);
      return call(
        { method: "GET", path: `/admin/v1/accounts/${seg(account!)}/connections` },
        "connection-list",
      );
    }
    case "connections show":
    case "connections update":
    case "connections delete": {
      const [account, connection] = positionals(rest, ["account", "connection"], command);
      const path = `/admin/v1/accounts/${seg(account!)}/connections/${seg(connection!)}`;
      if (command === "connections show") return call({ method: "GET", path }, "connection-show");
      if (command === "connections delete") return call({ method: "DELETE", path }, "deleted");
      const budget = budgetChange(values);
      const limits = connectionLimits(values);
      if (budget === undefined && Object.keys(limits).length === 0) {
        throw new UsageError("'connections update' needs --budget, --no-budget or a limit option");
      }
      return call(
        {
          method: "PATCH",
          path,
          body: defined({ budget, limits: Object.keys(limits).length > 0 ? limits : undefined }),
        },
        "connection-updated",
      );
    }
    case "keys show": {
      const [keyId] = positionals(rest, ["keyId"], command);
      return call({ method: "GET", path: `/admin/v1/keys/${seg(keyId!)}` }, "key-show");
    }
    case "keys update": {
      const [keyId] = positionals(rest, ["keyId"], command);
      const budget = budgetChange(values);
      if (budget === undefined) throw new UsageError("'keys update' needs --budget or --no-budget");
      return call(
        { method: "PATCH", path: `/admin/v1/keys/${seg(keyId!)}`, body: { budget } },
        "key-updated",
      );
    }
    case "keys list": {
      const [account] = positionals(rest, ["account"], command);
      const connection = str(values, "connection");
      const query = connection === undefined ? "" : `?${new URLSearchParams({ connection })}`;
      return call({ method: "GET", path: `/admin/v1/accounts/${seg(account!)}/keys${query}` }, "key-list");
    }
    case "keys revoke": {
      const [keyId] = positionals(rest, ["keyId"], command);
      return call({ method: "POST", path: `/admin/v1/keys/${seg(keyId!)}/revoke` }, "key-revoked");
    }
    case "keys rotate": {
      const [keyId] = positionals(rest, ["keyId"], command);
      const grace = str(values, "grace");
      const expires = str(values, "expires");
      return call(
        {
          method: "POST",
          path: `/admin/v1/keys/${seg(keyId!)}/rotate`,
          body: defined({
            grace_seconds: grace === undefined ? undefined : parseDuration(grace),
            expires_at: expires === undefined ? undefined : parseTime(expires, "--expires"),
          }),
        },
        "key-rotated",
      );
    }
    default: {
      positionals(rest, [], command);
      const by = str(values, "by")?.split(",");
      const periods = by?.filter((b) => b === "hour" || b === "day") ?? [];
      if (by && (by.some((b) => b !== "hour" && b !== "day" && b !== "model") || periods.length > 1)) {
        throw new UsageError("--by must be hour, day or model, or a period and model (day,model)");
      }
      const from = str(values, "from");
      const to = str(values, "to");
      const query = new URLSearchParams(
        defined({
          account: str(values, "account"),
          connection: str(values, "connection"),
          key: str(values, "key"),
          model: str(values, "model"),
          from: from === undefined ? undefined : parseTime(from, "--from"),
          to: to === undefined ? undefined : parseTime(to, "--to"),
          granularity: periods[0],
          group_by: by?.includes("model") ? "model" : undefined,
        }) as Record<string, string>,
      ).toString();
      return call({ method: "GET", path: `/admin/v1/usage${query ? `?${query}` : ""}` }, "usage");
    }
  }
}
