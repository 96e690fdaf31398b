// Virtual key lifecycle end to end (docs/account-door.md, "Keys and the admin API"): tollgatectl, run as its own
// process against the admin port of api-edge #1, drives accounts, connections and keys; two
// api-edge replicas serve the public door over real NATS and Redis.

import { spawn } from "node:child_process";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { REPO_ROOT, type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const CLI = join(REPO_ROOT, "packages/tollgatectl/src/cli.ts");
const namespace = uniqueNamespace("admin");
const ACCOUNT = `acct-${namespace}`;
const CONNECTION = "main";
/** Prices of tollgate-mini in deploy/config/tollgate.yaml, base units per million tokens. */
const MINI_PRICES = { input: 150_000n, output: 600_000n };

let nats: NatsFixture;
let redis: RedisFixture;
let stack: Stack;
/** Every secret this run saw, to prove none reached a log line. */
const secrets: string[] = [];

interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
  /** performance.now() when the process exited: the moment the CLI "returned". */
  exitedAt: number;
}

/** Runs tollgatectl as its own process, pointed at api-edge #1's admin port. */
function tollgatectl(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", CLI, ...args], {
      cwd: REPO_ROOT,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        TOLLGATE_ADMIN_URL: stack.adminUrls[0],
        TOLLGATE_ADMIN_TOKEN: stack.adminToken,
        ...env,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    let exitedAt = 0;
    child.stdout.on("data", (c: Buffer) => (stdout += c.toString("utf8")));
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString("utf8")));
    child.once("exit", () => (exitedAt = performance.now()));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr, exitedAt }));
  });
}

/** Runs tollgatectl with --json and expects success. */
async function ctlJson<T>(args: string[]): Promise<T> {
  const r = await tollgatectl([...args, "--json"]);
  expect(r.stderr.replace(/^warning: .*\n/m, ""), r.stderr).toBe("");
  expect(r.code).toBe(0);
  return JSON.parse(r.stdout) as T;
}

interface KeyJson {
  id: string;
  state: string;
  grace_ends_at: string | null;
  rotated_to: string | null;
}

/** GET /v1/models with a key on one edge: the status and, on refusal, the error code. */
async function models(url: string, key: string): Promise<{ status: number; code?: string; ids?: string[] }> {
  const res = await fetch(`${url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
  const body = (await res.json()) as { data?: { id: string }[]; error?: { code: string } };
  return res.status === 200
    ? { status: 200, ids: body.data?.map((m) => m.id) ?? [] }
    : { status: res.status, ...(body.error ? { code: body.error.code } : {}) };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

beforeAll(async () => {
  nats = await useNats();
  redis = await useRedis();
  stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1, edges: 2 });
}, 120_000);

afterAll(async () => {
  await stack?.stop();
  await nats?.stop();
  await redis?.stop();
});

describe("virtual key lifecycle through tollgatectl, two api-edge replicas", () => {
  it("runs two api-edge replicas, each with its own public and admin port", () => {
    expect(stack.urls).toHaveLength(2);
    expect(stack.adminUrls).toHaveLength(2);
    expect(new Set([...stack.urls, ...stack.adminUrls]).size).toBe(4);
    expect(stack.processes.filter((p) => p.name.startsWith("api-edge")).map((p) => p.name)).toEqual([
      "api-edge-1",
      "api-edge-2",
    ]);
  });

  it("serves admin routes only on the admin port, and only with the token", async () => {
    const admin = (url: string, init: RequestInit = {}) =>
      fetch(url, init).then(async (r) => ({
        status: r.status,
        body: (await r.json()) as { error?: { code: string } },
      }));
    const bearer = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
    for (const [i, url] of stack.urls.entries()) {
      // The public port has no admin route, even with the right token.
      const onPublic = await admin(`${url}/admin/v1/accounts/${ACCOUNT}/keys`, bearer(stack.adminToken));
      expect(onPublic.status).toBe(404);
      expect(onPublic.body.error?.code).toBe("not_found");
      const post = await admin(`${url}/admin/v1/accounts`, {
        method: "POST",
        headers: { authorization: `Bearer ${stack.adminToken}`, "content-type": "application/json" },
        body: JSON.stringify({ id: `${ACCOUNT}-public` }),
      });
      expect(post.status).toBe(404);

      const adminUrl = stack.adminUrls[i]!;
      const none = await admin(`${adminUrl}/admin/v1/accounts/${ACCOUNT}/keys`);
      expect(none.status).toBe(401);
      expect(none.body.error?.code).toBe("missing_admin_token");
      const wrong = await admin(
        `${adminUrl}/admin/v1/accounts/${ACCOUNT}/keys`,
        bearer(`${stack.adminToken}x`),
      );
      expect(wrong.status).toBe(401);
      expect(wrong.body.error?.code).toBe("invalid_admin_token");
      // A Virtual Key is not an admin token.
      const virtualKey = await admin(`${adminUrl}/admin/v1/accounts/${ACCOUNT}/keys`, bearer(stack.demoKey));
      expect(virtualKey.status).toBe(401);
      // And the admin port serves no public route.
      expect((await admin(`${adminUrl}/v1/models`, bearer(stack.adminToken))).status).toBe(404);
    }
    // Nothing was created through the public port.
    const accounts = await tollgatectl(["keys", "list", `${ACCOUNT}-public`]);
    expect(accounts.code).toBe(1);
    expect(accounts.stderr).toContain("HTTP 404");
  });

  it("tollgatectl refuses without the token (exit 1) and on a bad command line (exit 2)", async () => {
    const wrong = await tollgatectl(["keys", "list", ACCOUNT], {
      TOLLGATE_ADMIN_TOKEN: "not-the-admin-token",
    });
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain("invalid_admin_token, HTTP 401");
    const bad = await tollgatectl(["keys", "rotate", "k", "--grace", "soon"]);
    expect(bad.code).toBe(2);
  });

  let revokeKeyId: string;
  let revokeSecret: string;

  it("creates an account, a connection and a key (shown once) that works on both edges", async () => {
    const account = await tollgatectl(["accounts", "create", ACCOUNT]);
    expect(account.code).toBe(0);
    expect(account.stdout).toContain(`created account ${ACCOUNT}`);
    const again = await tollgatectl(["accounts", "create", ACCOUNT]);
    expect(again.code).toBe(1);
    expect(again.stderr).toContain("account_exists, HTTP 409");

    const connection = await tollgatectl([
      "connections",
      "create",
      ACCOUNT,
      CONNECTION,
      "--models",
      "tollgate-mini,tollgate-pro",
      "--default",
      "tollgate-mini",
      "--max-output",
      "512",
    ]);
    expect(connection.code, connection.stderr).toBe(0);
    expect(connection.stdout).toContain("tollgate-mini, tollgate-pro (default tollgate-mini)");

    const key = await tollgatectl(["keys", "create", ACCOUNT, CONNECTION, "--name", "e2e"]);
    expect(key.code, key.stderr).toBe(0);
    expect(key.stderr).toContain("shown only now");
    revokeSecret = /secret: (tg_\S+)/.exec(key.stdout)?.[1] ?? "";
    revokeKeyId = /created key (\S+)/.exec(key.stdout)?.[1] ?? "";
    expect(revokeSecret).toMatch(/^tg_[A-Za-z0-9]{40}$/);
    secrets.push(revokeSecret);

    for (const url of stack.urls) {
      expect(await models(url, revokeSecret)).toEqual({
        status: 200,
        ids: ["tollgate-mini", "tollgate-pro"],
      });
    }

    const list = await tollgatectl(["keys", "list", ACCOUNT]);
    expect(list.code).toBe(0);
    expect(list.stdout).toContain(revokeKeyId);
    expect(list.stdout).toContain(revokeSecret.slice(-4));
    expect(list.stdout).not.toContain(revokeSecret);
  });

  it("revocation through tollgatectl is refused by both edges within one second", async () => {
    // Both edges have just served the key (any cache in front of auth-policy is warm).
    for (const url of stack.urls) expect((await models(url, revokeSecret)).status).toBe(200);

    const revoke = await tollgatectl(["keys", "revoke", revokeKeyId]);
    expect(revoke.code, revoke.stderr).toBe(0);
    expect(revoke.stdout).toContain(`revoked key ${revokeKeyId}`);

    // Poll both edges every 50 ms from the moment the CLI returned.
    const refusedAfter: (number | undefined)[] = stack.urls.map(() => undefined);
    const deadline = revoke.exitedAt + 3_000;
    for (;;) {
      const round = await Promise.all(stack.urls.map((url) => models(url, revokeSecret)));
      const now = performance.now();
      for (const [i, r] of round.entries()) {
        if (refusedAfter[i] !== undefined) continue;
        if (r.status === 401) {
          expect(r.code).toBe("revoked_api_key");
          refusedAfter[i] = now - revoke.exitedAt;
        } else expect(r.status).toBe(200);
      }
      if (refusedAfter.every((t) => t !== undefined) || now > deadline) break;
      await sleep(50);
    }
    const elapsed = Math.max(...refusedAfter.map((t) => t ?? Number.POSITIVE_INFINITY));
    console.log(
      `revocation: refused by both edges ${elapsed.toFixed(1)} ms after tollgatectl returned ` +
        `(edge 1 ${refusedAfter[0]?.toFixed(1)} ms, edge 2 ${refusedAfter[1]?.toFixed(1)} ms)`,
    );
    expect(elapsed).toBeLessThan(1_000);
    // And it stays refused.
    for (const url of stack.urls)
      expect(await models(url, revokeSecret)).toEqual({ status: 401, code: "revoked_api_key" });
  });

  let liveSecret: string;
  let liveKeyId: string;

  it("rotation with --grace 2: old and new keys both work, then only the new one", async () => {
    const created = await ctlJson<{ key: KeyJson; secret: string }>(["keys", "create", ACCOUNT, CONNECTION]);
    secrets.push(created.secret);
    for (const url of stack.urls) expect((await models(url, created.secret)).status).toBe(200);

    const rotate = await tollgatectl(["keys", "rotate", created.key.id, "--grace", "2", "--json"]);
    expect(rotate.code, rotate.stderr).toBe(0);
    expect(rotate.stderr).toContain("shown only now");
    const rotated = JSON.parse(rotate.stdout) as { old_key: KeyJson; new_key: KeyJson; secret: string };
    secrets.push(rotated.secret);
    expect(rotated.old_key).toMatchObject({
      id: created.key.id,
      state: "rotating",
      rotated_to: rotated.new_key.id,
    });
    expect(rotated.new_key.state).toBe("active");
    const graceEnds = Date.parse(rotated.old_key.grace_ends_at ?? "");

    // Within the grace window, both keys work on both edges.
    for (const url of stack.urls) {
      expect((await models(url, created.secret)).status).toBe(200);
      expect((await models(url, rotated.secret)).status).toBe(200);
    }
    expect(Date.now()).toBeLessThan(graceEnds);

    // After it, the old key is refused everywhere; the new one keeps working.
    let old: { status: number; code?: string }[] = [];
    while (Date.now() < graceEnds + 3_000) {
      old = await Promise.all(stack.urls.map((url) => models(url, created.secret)));
      if (old.every((r) => r.status === 401)) break;
      await sleep(50);
    }
    const stoppedAt = Date.now();
    expect(old).toEqual(stack.urls.map(() => ({ status: 401, code: "rotated_api_key" })));
    // The window was honoured: not cut short, and closed within a second of its end.
    expect(stoppedAt).toBeGreaterThanOrEqual(graceEnds);
    expect(stoppedAt - graceEnds).toBeLessThan(1_000);
    for (const url of stack.urls) expect((await models(url, rotated.secret)).status).toBe(200);

    const list = await ctlJson<{ data: KeyJson[] }>(["keys", "list", ACCOUNT, "--connection", CONNECTION]);
    const state = Object.fromEntries(list.data.map((k) => [k.id, k.state]));
    expect(state).toEqual({
      [revokeKeyId]: "revoked",
      [created.key.id]: "rotated",
      [rotated.new_key.id]: "active",
    });
    liveSecret = rotated.secret;
    liveKeyId = rotated.new_key.id;
  });

  it("tollgatectl usage shows the requests and spend that were served, to the base unit", async () => {
    const served: { input: number; output: number }[] = [];
    for (const [i, url] of stack.urls.entries()) {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${liveSecret}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: 3 + i,
          messages: [{ role: "user", content: `usage check ${i} for ${namespace}` }],
        }),
      });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
      served.push({ input: body.usage.prompt_tokens, output: body.usage.completion_tokens });
    }
    // Spend per request as the price list says: integer base units, rounded up once.
    const expectedCost = served.reduce(
      (sum, s) =>
        sum +
        (BigInt(s.input) * MINI_PRICES.input + BigInt(s.output) * MINI_PRICES.output + 999_999n) / 1_000_000n,
      0n,
    );

    // Metering applies usage events asynchronously; wait until both are in.
    type Usage = {
      totals: { requests: number; input_tokens: number; output_tokens: number; cost: string };
      buckets: unknown[];
    };
    let usage: Usage | undefined;
    for (let i = 0; i < 60; i++) {
      const res = await fetch(`${stack.adminUrls[1]}/admin/v1/usage?account=${ACCOUNT}`, {
        headers: { authorization: `Bearer ${stack.adminToken}` },
      });
      usage = (await res.json()) as Usage;
      if (usage.totals.requests >= served.length) break;
      await sleep(250);
    }

    const fromCli = await ctlJson<Usage>(["usage", "--account", ACCOUNT, "--by", "hour"]);
    expect(fromCli.totals).toEqual({
      requests: 2,
      input_tokens: served.reduce((n, s) => n + s.input, 0),
      output_tokens: served.reduce((n, s) => n + s.output, 0),
      reasoning_tokens: 0,
      cost: expectedCost.toString(),
    });
    expect(expectedCost).toBeGreaterThan(0n);
    // The key filter sees the same (both requests used the live key).
    const byKey = await ctlJson<Usage>(["usage", "--key", liveKeyId]);
    expect(byKey.totals.cost).toBe(expectedCost.toString());
    // By day and model: the served model's row carries the whole spend.
    const byModel = await ctlJson<Omit<Usage, "buckets"> & { buckets: { model: string; cost: string }[] }>([
      "usage",
      "--account",
      ACCOUNT,
      "--by",
      "day,model",
    ]);
    expect(byModel.buckets.map((b) => [b.model, b.cost])).toEqual([
      ["tollgate-mini", expectedCost.toString()],
    ]);

    const table = await tollgatectl(["usage", "--account", ACCOUNT]);
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(new RegExp(`^TOTAL\\s+2\\s+.*\\s${expectedCost}\\s+\\d+\\.\\d{6}$`, "m"));
  });

  it("the bin `tollgatectl` runs", async () => {
    const bin = join(REPO_ROOT, "node_modules/.bin/tollgatectl");
    const out = await new Promise<{ code: number | null; stdout: string }>((resolve, reject) => {
      const child = spawn(bin, ["--help"], {
        env: { PATH: `${join(REPO_ROOT, "node_modules/.bin")}:${process.env.PATH}`, HOME: process.env.HOME },
        stdio: ["ignore", "pipe", "inherit"],
      });
      let stdout = "";
      child.stdout.on("data", (c: Buffer) => (stdout += c.toString("utf8")));
      child.once("error", reject);
      child.once("close", (code) => resolve({ code, stdout }));
    });
    expect(out.code).toBe(0);
    expect(out.stdout).toContain("keys revoke <keyId>");
  });

  it("never logs the admin token or a key secret", () => {
    const logs = stack.output();
    expect(logs).toContain("admin request served");
    expect(logs).not.toContain(stack.adminToken);
    for (const secret of secrets) expect(logs).not.toContain(secret);
  });
});
