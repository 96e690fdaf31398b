import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";

const MAIN = fileURLToPath(new URL("../src/main.ts", import.meta.url));

/** An operator's real Virtual Key, as distinctive as a leak would be easy to find. */
const OPERATOR_SECRET = "tg_SWEEPCFGSECRET_0123456789abcdef0123456789";

let child: ChildProcess | undefined;
let dir: string | undefined;

afterEach(async () => {
  if (child && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((resolve) => child!.once("exit", resolve));
    child.kill("SIGKILL");
    await exited;
  }
  child = undefined;
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

describe("the all-in-one process on an operator's configuration", () => {
  it("prints and logs none of its keys at start, at the most verbose log level", async () => {
    dir = mkdtempSync(join(tmpdir(), "tollgate-operator-key-"));
    const config = join(dir, "tollgate.yaml");
    writeFileSync(
      config,
      [
        "upstreams:",
        "  - { id: local, baseUrl: 'http://127.0.0.1:9/v1' }",
        "models:",
        "  - { id: house-model, upstream: local, upstreamModel: m, runtime: vllm, pricing: { inputPerMillion: 1, outputPerMillion: 1 } }",
        "accounts:",
        "  - id: acme",
        "    connections:",
        "      - id: main",
        "        models: [house-model]",
        "        defaultModel: house-model",
        `        keys: [{ id: prod, secret: ${OPERATOR_SECRET} }]`,
        "",
      ].join("\n"),
    );
    // Exactly as `npm start` runs it, with only the environment below; logs on stdout, the
    // banner on stderr.
    child = spawn(process.execPath, ["--import", "tsx", MAIN], {
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        PORT: "0",
        METRICS_PORT: "0",
        LOG_LEVEL: "trace",
        TOLLGATE_CONFIG: config,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout!.on("data", (c: Buffer) => {
      output += c.toString("utf8");
    });
    child.stderr!.on("data", (c: Buffer) => {
      output += c.toString("utf8");
    });
    const deadline = Date.now() + 30_000;
    while (!output.includes("Try it:") && child.exitCode === null && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    // And whatever is logged just after the banner.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    expect(output).toContain("Tollgate is running on");
    expect(output).not.toContain("SWEEPCFGSECRET");
    expect(output).not.toContain("demo key:");
    expect(output).toContain("use one of your configuration's keys");
  });
});
