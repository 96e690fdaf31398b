import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const BUILD = fileURLToPath(new URL("../build.mjs", import.meta.url));
const TOKEN = "admin-token-0123456789abcdef";

let dir: string;
let server: Server;
let url: string;
const seen: IncomingMessage[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "tollgatectl-bin-"));
  await run(process.execPath, [BUILD, dir]);
  server = createServer((req, res) => {
    seen.push(req);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        object: "list",
        data: [
          {
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
            budget: { amount: "5000000", period: "month" },
          },
        ],
      }),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
});

afterAll(async () => {
  await new Promise((resolve) => server?.close(resolve));
});

/** Runs the built file with plain node, from a folder outside the clone, with no NODE_OPTIONS. */
const tollgatectl = (args: string[]) =>
  run(process.execPath, [join(dir, "tollgatectl.mjs"), ...args], {
    cwd: dir,
    env: { PATH: process.env.PATH, TOLLGATE_ADMIN_URL: url, TOLLGATE_ADMIN_TOKEN: TOKEN },
  });

describe("the built tollgatectl", () => {
  it("is one file that imports only Node built-ins, with a node hashbang, and a package without dependencies", () => {
    const code = readFileSync(join(dir, "tollgatectl.mjs"), "utf8");
    expect(code.startsWith("#!/usr/bin/env node\n")).toBe(true);
    expect(code).not.toMatch(/from\s+["'](?!node:)[^"']+["']/);
    const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
    expect(pkg.bin).toEqual({ tollgatectl: "tollgatectl.mjs" });
    expect(pkg.dependencies).toBeUndefined();
  });

  it("runs with plain node outside the clone: help, and a real call to the admin API", async () => {
    const help = await tollgatectl(["--help"]);
    expect(help.stdout).toContain("Usage: tollgatectl");
    const listed = await tollgatectl(["keys", "list", "acme"]);
    expect(listed.stdout).toContain("key_1");
    expect(listed.stdout).toContain("5000000/month");
    expect(seen.at(-1)?.url).toBe("/admin/v1/accounts/acme/keys");
    expect(seen.at(-1)?.headers.authorization).toBe(`Bearer ${TOKEN}`);
    expect(listed.stdout + listed.stderr).not.toContain(TOKEN);
  });

  it("packs into a tarball that `npm exec` runs from a folder outside the clone, with --json", async () => {
    const packDir = mkdtempSync(join(tmpdir(), "tollgatectl-pack-"));
    const packed = await run("npm", ["pack", dir, "--pack-destination", packDir, "--loglevel=error"], {
      cwd: packDir,
    });
    const tarball = join(packDir, packed.stdout.trim().split("\n").at(-1)!);
    const elsewhere = mkdtempSync(join(tmpdir(), "tollgatectl-elsewhere-"));
    const listed = await run(
      "npm",
      [
        "exec",
        "--yes",
        "--prefer-offline",
        `--package=${tarball}`,
        "--",
        "tollgatectl",
        "keys",
        "list",
        "acme",
        "--json",
      ],
      {
        cwd: elsewhere,
        env: {
          ...process.env,
          TOLLGATE_ADMIN_URL: url,
          TOLLGATE_ADMIN_TOKEN: TOKEN,
          npm_config_loglevel: "error",
        },
      },
    );
    expect(JSON.parse(listed.stdout)).toMatchObject({ object: "list", data: [{ id: "key_1" }] });
    expect(seen.at(-1)?.url).toBe("/admin/v1/accounts/acme/keys");
  });
});
