// Readable views of the admin API's answers. Pure: strings in, strings out.

import type { View } from "./args.js";

/** A key as the admin API shows it (never its secret). */
export interface KeyJson {
  id: string;
  account_id: string;
  connection_id: string;
  name: string;
  state: string;
  last4: string;
  created_at: string | null;
  expires_at: string | null;
  revoked_at: string | null;
  rotated_from: string | null;
  rotated_to: string | null;
  grace_ends_at: string | null;
  budget?: BudgetJson | null;
  budget_usage?: BudgetUsageJson;
}

/** A budget's current period as the admin API shows it: base units as decimal strings. */
export interface BudgetUsageJson {
  spent: string;
  held: string;
  remaining: string;
  period_start: string | null;
  period_end: string | null;
}

/** A spend cap as the admin API shows it: base units per period. */
export interface BudgetJson {
  amount: string;
  period?: string;
  period_days?: number;
}

interface LimitsJson {
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
}

interface TotalsJson {
  requests: number;
  input_tokens: number;
  output_tokens: number;
  reasoning_tokens: number;
  cost: string;
}

/** What to print: `out` to stdout, `err` (warnings) to stderr. */
export interface Rendered {
  out: string;
  err?: string;
}

/** Decimals of the payment token: 1000000 base units = 1 unit = 1 USD. */
const DECIMALS = 6;

export const SECRET_WARNING =
  "warning: this secret is shown only now; it is stored only as a hash and cannot be shown again. Store it securely.";

/** A decimal string of base units as token units, exactly: "1234" → "0.001234". */
export function formatCost(baseUnits: string): string {
  if (!/^\d+$/.test(baseUnits)) return baseUnits;
  const digits = baseUnits.padStart(DECIMALS + 1, "0");
  return `${digits.slice(0, -DECIMALS)}.${digits.slice(-DECIMALS)}`;
}

/** Left-aligned text columns, right-aligned numeric ones, two spaces apart. */
export function table(
  header: readonly string[],
  rows: readonly (readonly string[])[],
  numeric: readonly number[] = [],
) {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (numeric.includes(i) ? c.padStart(widths[i]!) : c.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}

/** "5.000000 USD (5000000 base units) per month", or "none". */
export function formatBudget(b: BudgetJson | null | undefined): string {
  if (!b) return "none";
  const per = b.period_days !== undefined ? `per ${b.period_days} days` : `per ${b.period ?? "month"}`;
  return `${formatCost(b.amount)} USD (${b.amount} base units) ${per}`;
}

/** "150 spent, 300 held by running requests, 550 left (base units), 2030-01-07 to 2030-01-14". */
export function formatUsage(u: BudgetUsageJson): string {
  const day = (t: string | null) => (t ? t.slice(0, 10) : "-");
  return `${u.spent} spent, ${u.held} held by running requests, ${u.remaining} left (base units) from ${day(u.period_start)} to ${day(u.period_end)} (UTC)`;
}

const when = (t: string | null) => (t ? t.replace(/\.\d+Z$/, "Z") : "-");

function limits(l: LimitsJson | undefined, prefix = ""): string[] {
  const out: string[] = [];
  if (l?.requests_per_minute != null) out.push(`${prefix}${l.requests_per_minute} requests/min`);
  if (l?.tokens_per_minute != null) out.push(`${prefix}${l.tokens_per_minute} tokens/min`);
  return out;
}

function keyNote(k: KeyJson): string {
  if (k.state === "rotating") return `rotated to ${k.rotated_to}, works until ${when(k.grace_ends_at)}`;
  if (k.state === "rotated") return `rotated to ${k.rotated_to}`;
  if (k.state === "revoked") return `revoked ${when(k.revoked_at)}`;
  if (k.rotated_from) return `replaces ${k.rotated_from}`;
  return "";
}

function keyList(body: { data: KeyJson[] }): string {
  if (body.data.length === 0) return "no keys";
  return table(
    ["ID", "CONNECTION", "NAME", "STATE", "LAST4", "CREATED", "EXPIRES", "BUDGET", "NOTE"],
    body.data.map((k) => [
      k.id,
      k.connection_id,
      k.name || "-",
      k.state,
      k.last4 || "-",
      when(k.created_at),
      when(k.expires_at),
      k.budget
        ? `${k.budget.amount}/${k.budget.period_days !== undefined ? `${k.budget.period_days}d` : (k.budget.period ?? "month")}`
        : "-",
      keyNote(k),
    ]),
  );
}

function usage(body: {
  granularity: string;
  group_by?: "model";
  totals: TotalsJson;
  buckets: (TotalsJson & { start: string; model?: string })[];
}) {
  const byModel = body.group_by === "model";
  const row = (label: string, t: TotalsJson, model = "") => [
    label,
    ...(byModel ? [model] : []),
    String(t.requests),
    String(t.input_tokens),
    String(t.output_tokens),
    String(t.reasoning_tokens),
    t.cost,
    formatCost(t.cost),
  ];
  return table(
    [
      body.granularity === "day" ? "DAY (UTC)" : "HOUR (UTC)",
      ...(byModel ? ["MODEL"] : []),
      "REQUESTS",
      "INPUT",
      "OUTPUT",
      "REASONING",
      "SPEND (base units)",
      "SPEND (USD)",
    ],
    [...body.buckets.map((b) => row(when(b.start), b, b.model)), row("TOTAL", body.totals)],
    byModel ? [2, 3, 4, 5, 6, 7] : [1, 2, 3, 4, 5, 6],
  );
}

interface AccountJson {
  id: string;
  limits?: LimitsJson;
  created_at: string | null;
}

interface ConnectionJson {
  id: string;
  account_id: string;
  models: string[];
  default_model: string;
  default_max_output_tokens: number;
  max_output_tokens: number;
  routes: string[] | null;
  limits?: LimitsJson & {
    key_requests_per_minute: number | null;
    key_tokens_per_minute: number | null;
    routes?: Record<string, LimitsJson>;
  };
  budget?: BudgetJson | null;
  budget_usage?: BudgetUsageJson;
}

function connectionLimits(c: ConnectionJson): string[] {
  return [
    ...limits(c.limits),
    ...limits(
      {
        requests_per_minute: c.limits?.key_requests_per_minute ?? null,
        tokens_per_minute: c.limits?.key_tokens_per_minute ?? null,
      },
      "per key ",
    ),
    ...Object.entries(c.limits?.routes ?? {}).flatMap(([r, rl]) => limits(rl, `${r} `)),
  ];
}

function connectionLines(c: ConnectionJson, title: string): string {
  const l = connectionLimits(c);
  return [
    `${title} ${c.account_id}/${c.id}`,
    `  models:     ${c.models.join(", ")} (default ${c.default_model})`,
    `  output cap: ${c.default_max_output_tokens} by default, at most ${c.max_output_tokens}`,
    `  routes:     ${c.routes ? c.routes.join(", ") : "all"}`,
    `  limits:     ${l.length > 0 ? l.join(", ") : "none"}`,
    `  budget:     ${formatBudget(c.budget)}`,
    ...(c.budget_usage ? [`  this period: ${formatUsage(c.budget_usage)}`] : []),
  ].join("\n");
}

function connectionTable(list: readonly ConnectionJson[]): string {
  return table(
    ["ID", "MODELS", "DEFAULT", "ROUTES", "BUDGET"],
    list.map((c) => [
      c.id,
      c.models.join(","),
      c.default_model,
      c.routes ? c.routes.join(",") : "all",
      shortBudget(c.budget),
    ]),
  );
}

/** "5000000/month", or "-". */
function shortBudget(b: BudgetJson | null | undefined): string {
  if (!b) return "-";
  return `${b.amount}/${b.period_days !== undefined ? `${b.period_days}d` : (b.period ?? "month")}`;
}

/** The readable view of one answer. */
export function render(view: View, body: unknown): Rendered {
  switch (view) {
    case "account": {
      const a = body as { id: string; limits?: LimitsJson };
      const l = limits(a.limits);
      return { out: `created account ${a.id}${l.length > 0 ? ` (limits: ${l.join(", ")})` : ""}` };
    }
    case "connection":
      return { out: connectionLines(body as ConnectionJson, "created connection") };
    case "connection-show":
      return { out: connectionLines(body as ConnectionJson, "connection") };
    case "connection-updated":
      return { out: connectionLines(body as ConnectionJson, "updated connection") };
    case "connection-list": {
      const { data } = body as { data: ConnectionJson[] };
      return { out: data.length === 0 ? "no connections" : connectionTable(data) };
    }
    case "account-list": {
      const { data } = body as { data: AccountJson[] };
      if (data.length === 0) return { out: "no accounts" };
      return {
        out: table(
          ["ID", "CREATED", "LIMITS"],
          data.map((a) => [a.id, when(a.created_at), limits(a.limits).join(", ") || "none"]),
        ),
      };
    }
    case "account-show": {
      const a = body as AccountJson & { connections: ConnectionJson[] };
      return {
        out: [
          `account ${a.id}, created ${when(a.created_at)}`,
          `  limits: ${limits(a.limits).join(", ") || "none"}`,
          "",
          a.connections.length === 0 ? "no connections" : connectionTable(a.connections),
        ].join("\n"),
      };
    }
    case "account-updated": {
      const a = body as AccountJson;
      return { out: `updated account ${a.id} (limits: ${limits(a.limits).join(", ") || "none"})` };
    }
    case "deleted": {
      const d = body as { id: string; object: string; account_id?: string; revoked_keys: KeyJson[] };
      const what = d.object === "connection" ? `connection ${d.account_id}/${d.id}` : `account ${d.id}`;
      const ids = d.revoked_keys.map((k) => k.id);
      return {
        out: `deleted ${what}; revoked ${ids.length} key${ids.length === 1 ? "" : "s"}${ids.length > 0 ? `: ${ids.join(", ")}` : ""}`,
      };
    }
    case "key-show": {
      const k = body as KeyJson;
      return {
        out: [
          `key ${k.id} (${k.account_id}/${k.connection_id})${k.name ? ` ${k.name}` : ""}`,
          `  state:   ${k.state}${keyNote(k) ? ` (${keyNote(k)})` : ""}`,
          `  last4:   ${k.last4 || "-"}`,
          `  created: ${when(k.created_at)}   expires: ${k.expires_at ? when(k.expires_at) : "never"}`,
          `  budget:  ${formatBudget(k.budget)}`,
          ...(k.budget_usage ? [`  this period: ${formatUsage(k.budget_usage)}`] : []),
        ].join("\n"),
      };
    }
    case "key-updated": {
      const k = body as KeyJson;
      return { out: `updated key ${k.id}: budget ${formatBudget(k.budget)}` };
    }
    case "key-created": {
      const { key, secret } = body as { key: KeyJson; secret: string };
      return {
        out: [
          `created key ${key.id} for ${key.account_id}/${key.connection_id}${key.name ? ` (${key.name})` : ""}, expires ${key.expires_at ? when(key.expires_at) : "never"}${key.budget ? `, budget ${formatBudget(key.budget)}` : ""}`,
          `secret: ${secret}`,
        ].join("\n"),
        err: SECRET_WARNING,
      };
    }
    case "key-list":
      return { out: keyList(body as { data: KeyJson[] }) };
    case "key-revoked": {
      const { key } = body as { key: KeyJson };
      return {
        out: `revoked key ${key.id} (${key.account_id}/${key.connection_id}) at ${when(key.revoked_at)}`,
      };
    }
    case "key-rotated": {
      const r = body as { old_key: KeyJson; new_key: KeyJson; secret: string };
      const until =
        r.old_key.state === "rotating"
          ? `${r.old_key.id} keeps working until ${when(r.old_key.grace_ends_at)}`
          : `${r.old_key.id} no longer works`;
      return {
        out: [
          `rotated key ${r.old_key.id} -> ${r.new_key.id} (${r.new_key.account_id}/${r.new_key.connection_id}); ${until}`,
          `secret: ${r.secret}`,
        ].join("\n"),
        err: SECRET_WARNING,
      };
    }
    case "usage":
      return { out: usage(body as Parameters<typeof usage>[0]) };
  }
}
