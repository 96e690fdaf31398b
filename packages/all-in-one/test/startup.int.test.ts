import { createServer, type Server } from "node:net";
import { fileURLToPath } from "node:url";
import { configFile, type MainRun, oneKeyConfig, runMain, stopMains } from "@tollgate/testkit/main-process";
import { afterEach, describe, expect, it } from "vitest";

const MAIN = fileURLToPath(new URL("../src/main.ts", import.meta.url));
const ADMIN_TOKEN = "admin-token-never-printed-0123456789";

type Run = MainRun;
const servers: Server[] = [];

/** Runs the all-in-one main exactly as `npm start` does, with only `env` set. */
const run = (env: Record<string, string>): Run => runMain(MAIN, env);

/** Holds a free loopback port, as a second instance would find it. */
async function holdPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  servers.push(server);
  return (server.address() as { port: number }).port;
}

afterEach(async () => {
  await stopMains();
  for (const s of servers.splice(0)) await new Promise((resolve) => s.close(resolve));
});

const noStack = (text: string) => expect(text).not.toMatch(/^\s+at /m);

/** An operator's own configuration (one account, one model, one key of `secret`); its path. */
function operatorConfig(secret: string): string {
  return configFile(oneKeyConfig(secret));
}

/** Resolves once the banner's "Try it:" is out (or the process ended, or 30 s passed). */
async function bannerOf(r: Run): Promise<string> {
  const deadline = Date.now() + 30_000;
  while (!r.stderr().includes("Try it:") && r.child.exitCode === null && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return r.stderr();
}

describe("the all-in-one process at startup", () => {
  it("names the taken public address and PORT in one line, and exits non-zero", async () => {
    const port = await holdPort();
    const r = run({ PORT: String(port), METRICS_PORT: "0", TEMPO_DEVNET_PORT: "0" });
    expect(await r.exited).not.toBe(0);
    const text = r.stderr().trim();
    expect(text.split("\n")).toHaveLength(1);
    expect(text).toContain(`127.0.0.1:${port}`);
    expect(text).toMatch(/already in use/);
    expect(text).toMatch(/set PORT to a free port/);
    noStack(text);
  });

  it("names ADMIN_PORT when the admin port is the one taken", async () => {
    const port = await holdPort();
    const r = run({
      PORT: "0",
      METRICS_PORT: "0",
      TEMPO_DEVNET_PORT: "0",
      ADMIN_TOKEN,
      ADMIN_PORT: String(port),
    });
    expect(await r.exited).not.toBe(0);
    const text = r.stderr();
    expect(text).toContain(`127.0.0.1:${port}`);
    expect(text).toMatch(/set ADMIN_PORT to a free port/);
    expect(text).not.toContain(ADMIN_TOKEN);
    noStack(text);
  });

  it("prints each configuration problem once, without a stack", async () => {
    const r = run({ PORT: "not-a-port", ADMIN_TOKEN: "short" });
    expect(await r.exited).not.toBe(0);
    const text = r.stderr();
    expect(text.match(/PORT: /g)).toHaveLength(1);
    expect(text.match(/ADMIN_TOKEN: must be at least 16 characters/g)).toHaveLength(1);
    expect(text).not.toContain("problems:");
    noStack(text);
  });

  it("shows the admin API without its token and a curl example with a configured model", async () => {
    const config = operatorConfig("tg_dev_0123456789abcdef");
    const r = run({ PORT: "0", METRICS_PORT: "0", ADMIN_PORT: "0", ADMIN_TOKEN, TOLLGATE_CONFIG: config });
    const text = await bannerOf(r);
    expect(text).toMatch(/admin API: http:\/\/127\.0\.0\.1:\d+\/admin\/v1 \(on because ADMIN_TOKEN is set/);
    expect(text).toContain('"model":"house-model"');
    expect(text).not.toContain("tollgate-mini");
    expect(text).not.toContain(ADMIN_TOKEN);
  });

  it("prints and logs none of an operator's own keys at start, at the most verbose log level", async () => {
    // An operator's real Virtual Key, as distinctive as a leak would be easy to find.
    const secret = "tg_SWEEPCFGSECRET_0123456789abcdef0123456789";
    const r = run({
      PORT: "0",
      METRICS_PORT: "0",
      LOG_LEVEL: "trace",
      TOLLGATE_CONFIG: operatorConfig(secret),
    });
    const banner = await bannerOf(r);
    // And whatever is logged just after the banner.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    expect(banner).toContain("Tollgate is running on");
    expect(banner).toContain("use one of your configuration's keys");
    for (const text of [banner, r.stdout()]) {
      expect(text).not.toContain("SWEEPCFGSECRET");
      expect(text).not.toContain("demo key:");
    }
  });
});
