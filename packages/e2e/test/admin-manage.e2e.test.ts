// Managing accounts, connections and budgets end to end: tollgatectl, built into one file and
// run with plain node, against the admin port of api-edge #1; two api-edge replicas serve the
// public door over real NATS and Redis, so a deletion's revocations must reach both.

import { execFile, spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { REPO_ROOT, type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const namespace = uniqueNamespace("manage");
const ACCOUNT = `acct-${namespace}`;

let nats: NatsFixture;
let redis: RedisFixture;
let stack: Stack;
let bin: string;
const secrets: string[] = [];

interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the built tollgatectl with plain node from a folder outside the clone. */
function tollgatectl(args: string[]): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, ...args], {
      cwd: tmpdir(),
      env: {
        PATH: process.env.PATH,
        TOLLGATE_ADMIN_URL: stack.adminUrls[0],
        TOLLGATE_ADMIN_TOKEN: stack.adminToken,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c: Buffer) => (stdout += c.toString("utf8")));
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString("utf8")));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

async function ok(args: string[]): Promise<string> {
  const r = await tollgatectl(args);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout;
}

async function newKey(connection: string): Promise<{ id: string; secret: string }> {
  const out = await ok(["keys", "create", ACCOUNT, connection]);
  const secret = /secret: (tg_\S+)/.exec(out)?.[1] ?? "";
  const id = /created key (\S+)/.exec(out)?.[1] ?? "";
  secrets.push(secret);
  return { id, secret };
}

/** GET /v1/models with a key on one edge: the status and, on refusal, the error code. */
async function models(url: string, key: string): Promise<{ status: number; code?: string }> {
  const res = await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
  const body = (await res.json()) as { error?: { code: string } };
  return res.status === 200
    ? { status: 200 }
    : { status: res.status, ...(body.error ? { code: body.error.code } : {}) };
}

/** Polls both edges until the key is refused on each, or 3 s pass. */
async function refusedEverywhere(secret: string): Promise<boolean> {
  const deadline = Date.now() + 3_000;
  for (;;) {
    const round = await Promise.all(stack.urls.map((url) => models(url, secret)));
    if (round.every((r) => r.status === 401 && r.code === "revoked_api_key")) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

beforeAll(async () => {
  const dir = mkdtempSync(join(tmpdir(), "tollgatectl-e2e-"));
  await promisify(execFile)(process.execPath, [join(REPO_ROOT, "packages/tollgatectl/build.mjs"), dir]);
  bin = join(dir, "tollgatectl.mjs");
  nats = await useNats();
  redis = await useRedis();
  stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1, edges: 2 });
}, 120_000);

afterAll(async () => {
  await stack?.stop();
  await nats?.stop();
  await redis?.stop();
});

describe("accounts, connections and budgets through the built tollgatectl, two api-edge replicas", () => {
  it("lists and shows accounts and connections, and sets, shows and clears budgets", async () => {
    await ok(["accounts", "create", ACCOUNT]);
    await ok(["connections", "create", ACCOUNT, "main", "--models", "tollgate-mini", "--budget", "5000000"]);
    await ok(["connections", "create", ACCOUNT, "spare", "--models", "tollgate-mini"]);
    expect(await ok(["accounts", "list"])).toContain(ACCOUNT);
    const shown = await ok(["accounts", "show", ACCOUNT]);
    expect(shown).toMatch(/main\s+tollgate-mini\s+tollgate-mini\s+all\s+5000000\/month/);
    expect(shown).toMatch(/spare\s+tollgate-mini\s+tollgate-mini\s+all\s+-/);

    await ok(["connections", "update", ACCOUNT, "spare", "--budget", "250", "--budget-period", "7d"]);
    expect(await ok(["connections", "show", ACCOUNT, "spare"])).toContain(
      "budget:     0.000250 USD (250 base units) per 7 days",
    );
    const key = await newKey("main");
    await ok(["keys", "update", key.id, "--budget", "1000000", "--budget-period", "day"]);
    expect(await ok(["keys", "show", key.id])).toContain(
      "budget:  1.000000 USD (1000000 base units) per day",
    );
    await ok(["keys", "update", key.id, "--no-budget"]);
    expect(await ok(["keys", "show", key.id])).toContain("budget:  none");
    for (const url of stack.urls) expect((await models(url, key.secret)).status).toBe(200);
  });

  it("a key's budget shows what it spent this period, to the base unit of its usage", async () => {
    const key = await newKey("main");
    await ok(["keys", "update", key.id, "--budget", "5000000", "--budget-period", "day"]);
    const res = await fetch(`${stack.urls[1]}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key.secret}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "tollgate-mini",
        max_tokens: 16,
        messages: [{ role: "user", content: "Hi" }],
      }),
    });
    expect(res.status).toBe(200);
    // Usage settles through metering; poll until no hold is left.
    let shown = "";
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      shown = await ok(["keys", "show", key.id]);
      if (/ 0 held by running requests/.test(shown) && !/this period: 0 spent/.test(shown)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    const usage = JSON.parse(await ok(["usage", "--key", key.id, "--json"])) as { totals: { cost: string } };
    expect(BigInt(usage.totals.cost)).toBeGreaterThan(0n);
    const left = 5_000_000n - BigInt(usage.totals.cost);
    expect(shown).toContain(
      `this period: ${usage.totals.cost} spent, 0 held by running requests, ${left} left`,
    );
  });

  it("a rotated key's successor spends the same budget: the two keys together never pass it", async () => {
    const BUDGET = 100n;
    const key = await newKey("main");
    await ok(["keys", "update", key.id, "--budget", BUDGET.toString(), "--budget-period", "day"]);
    let told = 0n;
    let n = 0;
    /** One chat request on either edge: its status, and its cost added to what callers were told. */
    const chat = async (secret: string): Promise<number> => {
      const res = await fetch(`${stack.urls[n++ % 2]}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${secret}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: 16,
          messages: [{ role: "user", content: "Hi" }],
        }),
      });
      await res.arrayBuffer();
      if (res.status === 200) told += BigInt(res.headers.get("x-tollgate-cost") ?? "-1");
      return res.status;
    };
    const served: number[] = [];
    for (let i = 0; i < 30 && (served.at(-1) ?? 200) === 200; i++) served.push(await chat(key.secret));
    expect(served.filter((s) => s === 200).length).toBeGreaterThan(1);
    expect(served.at(-1)).toBe(402);

    const rotated = JSON.parse(await ok(["keys", "rotate", key.id, "--grace", "3600", "--json"])) as {
      new_key: { id: string; budget: { amount: string; period: string } | null };
      secret: string;
    };
    secrets.push(rotated.secret);
    expect(rotated.new_key.budget).toEqual({ amount: BUDGET.toString(), period: "day" });
    // Both keys, during the grace, are admitted only while a quote fits the one budget.
    const after: number[] = [];
    for (let i = 0; i < 12; i++) after.push(await chat(i % 2 ? key.secret : rotated.secret));
    expect(after.filter((s) => s !== 200 && s !== 402)).toEqual([]);
    expect(told).toBeLessThanOrEqual(BUDGET);

    // The books, once metering settled every request: what callers were told == the spend each
    // key shows (one counter), nothing held, nothing below zero.
    type Shown = { budget_usage?: { spent: string; held: string; remaining: string } };
    const usageOf = async (id: string) =>
      (JSON.parse(await ok(["keys", "show", id, "--json"])) as Shown).budget_usage;
    const deadline = Date.now() + 15_000;
    let usage = await usageOf(rotated.new_key.id);
    while (Date.now() < deadline && (usage?.held !== "0" || usage.spent !== told.toString())) {
      await new Promise((r) => setTimeout(r, 200));
      usage = await usageOf(rotated.new_key.id);
    }
    const expected = { spent: told.toString(), held: "0", remaining: (BUDGET - told).toString() };
    expect(usage).toEqual(expect.objectContaining(expected));
    expect(await usageOf(key.id)).toEqual(expect.objectContaining(expected));
  });

  it("deleting a connection revokes its keys on both edges; the other connection's keys still work", async () => {
    const doomed = await newKey("spare");
    const kept = await newKey("main");
    for (const url of stack.urls) expect((await models(url, doomed.secret)).status).toBe(200);
    const out = await ok(["connections", "delete", ACCOUNT, "spare"]);
    expect(out).toContain(`deleted connection ${ACCOUNT}/spare; revoked 1 key: ${doomed.id}`);
    expect(await refusedEverywhere(doomed.secret)).toBe(true);
    for (const url of stack.urls) expect((await models(url, kept.secret)).status).toBe(200);
    const gone = await tollgatectl(["connections", "show", ACCOUNT, "spare"]);
    expect(gone.code).toBe(1);
    expect(gone.stderr).toContain("connection_not_found, HTTP 404");
  });

  it("deleting an account revokes every key on both edges and removes it from the list", async () => {
    const last = await newKey("main");
    const out = await ok(["accounts", "delete", ACCOUNT]);
    expect(out).toMatch(new RegExp(`deleted account ${ACCOUNT}; revoked \\d+ keys?`));
    expect(await refusedEverywhere(last.secret)).toBe(true);
    expect(await ok(["accounts", "list"])).not.toContain(ACCOUNT);
    const gone = await tollgatectl(["accounts", "show", ACCOUNT]);
    expect(gone.stderr).toContain("account_not_found, HTTP 404");
  });

  it("never logs the admin token or a key secret", () => {
    const logs = stack.output();
    expect(logs).not.toContain(stack.adminToken);
    for (const secret of secrets) expect(logs).not.toContain(secret);
  });
});
