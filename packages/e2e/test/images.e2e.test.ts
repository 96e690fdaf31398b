import type { ServiceIdentity } from "@tollgate/kit/credentials";
import { type StackTokens, writeStackTokens } from "@tollgate/testkit/internal-auth";
// The service images: services/<name>/Dockerfile, checked where no container engine
// runs. Each Dockerfile passes a Dockerfile linter (dockerfile-utils) and the project's rules
// (multi-stage, `npm ci` of that workspace only, a distroless nonroot runtime with no shell
// steps, pinned base images, no secrets in ENV or ARG, the chart's ports exposed). Then each one
// is carried out the way `docker build` would: its build stage's COPY (through .dockerignore),
// ENV, WORKDIR and RUN steps in a scratch folder, its runtime stage's COPY --from into another,
// and the five resulting "images" run as a stack with plain node: no tsx, no node_modules, the
// HMAC secret read from a file as the chart mounts it, gRPC health SERVING as the kubelet's
// probes ask it, and a chat completion served end to end.

import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, posix } from "node:path";
import { checkGrpcHealth } from "@tollgate/kit/health";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import {
  freePort,
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { DEMO_CONFIG, imageNodeFlags, REPO_ROOT } from "@tollgate/testkit/stack";
import { validate } from "dockerfile-utils";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";

const SERVICES = readdirSync(join(REPO_ROOT, "services"), { withFileTypes: true })
  .filter((d) => d.isDirectory())
  .map((d) => d.name)
  .sort();
const RUNTIME_IMAGE = "gcr.io/distroless/nodejs20-debian12:nonroot";
const SECRETISH = /(SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|PRIVATE_KEY|PAYEE_KEY|CREDENTIALS?)/i;

interface Instruction {
  keyword: string;
  args: string;
  line: number;
}
interface Stage {
  from: string;
  name?: string;
  instructions: Instruction[];
}

/** Dockerfile instructions, continuation lines joined, comments dropped. */
function parseDockerfile(text: string): Instruction[] {
  const out: Instruction[] = [];
  let buffer = "";
  let start = 0;
  text.split("\n").forEach((raw, i) => {
    if (/^\s*#/.test(raw) || (buffer === "" && raw.trim() === "")) return;
    if (buffer === "") start = i + 1;
    if (raw.endsWith("\\")) {
      buffer += `${raw.slice(0, -1)} `;
      return;
    }
    buffer += raw;
    const m = /^\s*(\S+)\s+([\s\S]*)$/.exec(buffer);
    if (m) out.push({ keyword: m[1]!.toUpperCase(), args: m[2]!.trim(), line: start });
    buffer = "";
  });
  return out;
}

function stagesOf(instructions: Instruction[]): Stage[] {
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.keyword === "FROM") {
      const [from, as, name] = ins.args.split(/\s+/);
      stages.push({ from: from!, ...(as?.toUpperCase() === "AS" && name ? { name } : {}), instructions: [] });
    } else stages.at(-1)?.instructions.push(ins);
  }
  return stages;
}

/** .dockerignore as Docker applies it: the last pattern matching the path or a parent decides. */
function dockerignore(text: string): (path: string) => boolean {
  const rules = text
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"))
    .map((l) => {
      const negate = l.startsWith("!");
      const pattern = posix.normalize((negate ? l.slice(1) : l).replace(/^\/+/, ""));
      const re = pattern
        .split(/(\*\*\/|\*\*|\*|\?)/)
        .map((part) =>
          part === "**/"
            ? "(?:.*/)?"
            : part === "**"
              ? ".*"
              : part === "*"
                ? "[^/]*"
                : part === "?"
                  ? "[^/]"
                  : part.replace(/[.+^${}()|[\]\\]/g, "\\$&"),
        )
        .join("");
      return { negate, re: new RegExp(`^${re}$`) };
    });
  return (path) => {
    const parts = path.split("/");
    const candidates = parts.map((_, i) => parts.slice(0, i + 1).join("/"));
    let excluded = false;
    for (const rule of rules) if (candidates.some((c) => rule.re.test(c))) excluded = !rule.negate;
    return excluded;
  };
}

/** Every file under `dir` (relative to `base`), skipping what .dockerignore excludes. */
function contextFiles(base: string, rel: string, ignored: (p: string) => boolean): string[] {
  const full = join(base, rel);
  if (statSync(full).isFile()) return ignored(rel) ? [] : [rel];
  return readdirSync(full).flatMap((entry) => {
    const child = rel === "." ? entry : `${rel}/${entry}`;
    if (ignored(child) && statSync(join(base, child)).isFile()) return [];
    return contextFiles(base, child, ignored);
  });
}

/** A folder holding each stage's root file system, as `docker build` would leave it. */
interface BuiltImage {
  runtimeRoot: string;
  stages: Stage[];
  entrypoint: string[];
  user: string;
  exposed: number[];
  env: Record<string, string>;
}

/** Runs a Dockerfile's stages here: COPY, ENV, WORKDIR and RUN, in scratch folders. */
function buildImage(service: string, scratch: string): BuiltImage {
  const dockerfile = join(REPO_ROOT, "services", service, "Dockerfile");
  const stages = stagesOf(parseDockerfile(readFileSync(dockerfile, "utf8")));
  const ignored = dockerignore(readFileSync(join(REPO_ROOT, ".dockerignore"), "utf8"));
  const roots = new Map<string, string>();
  let last: BuiltImage | undefined;
  stages.forEach((stage, index) => {
    const root = join(scratch, `${service}-stage${index}`);
    mkdirSync(root, { recursive: true });
    if (stage.name) roots.set(stage.name, root);
    let workdir = "/";
    const env: Record<string, string> = {};
    const result: BuiltImage = { runtimeRoot: root, stages, entrypoint: [], user: "", exposed: [], env };
    for (const ins of stage.instructions) {
      const where = `${service}/Dockerfile:${ins.line}`;
      if (ins.keyword === "WORKDIR") {
        workdir = posix.resolve(workdir, ins.args);
        mkdirSync(join(root, workdir), { recursive: true });
      } else if (ins.keyword === "ENV") {
        for (const pair of ins.args.split(/\s+/)) {
          const [k, ...v] = pair.split("=");
          env[k!] = v.join("=");
        }
      } else if (ins.keyword === "COPY") {
        const words = ins.args.split(/\s+/);
        const from = words.find((w) => w.startsWith("--from="))?.slice("--from=".length);
        const paths = words.filter((w) => !w.startsWith("--"));
        const dest = posix.resolve(workdir, paths.at(-1)!);
        const sources = paths.slice(0, -1);
        const intoDir = paths.at(-1)!.endsWith("/") || sources.length > 1;
        for (const src of sources) {
          if (from !== undefined) {
            const fromRoot = roots.get(from);
            if (!fromRoot) throw new Error(`${where}: no stage ${from}`);
            const path = join(fromRoot, src);
            if (!existsSync(path)) throw new Error(`${where}: ${src} is not in stage ${from}`);
            const target =
              statSync(path).isDirectory() || !intoDir ? dest : posix.join(dest, posix.basename(src));
            cpSync(path, join(root, target), { recursive: true });
          } else {
            if (!existsSync(join(REPO_ROOT, src)))
              throw new Error(`${where}: ${src} is not in the repository`);
            const files = contextFiles(REPO_ROOT, src, ignored);
            if (files.length === 0) throw new Error(`${where}: .dockerignore leaves nothing of ${src}`);
            const isDir = statSync(join(REPO_ROOT, src)).isDirectory();
            for (const f of files) {
              const target = isDir
                ? posix.join(dest, f.slice(src.length + 1))
                : intoDir
                  ? posix.join(dest, posix.basename(f))
                  : dest;
              mkdirSync(dirname(join(root, target)), { recursive: true });
              cpSync(join(REPO_ROOT, f), join(root, target));
            }
          }
        }
      } else if (ins.keyword === "RUN") {
        const run = spawnSync("sh", ["-c", ins.args], {
          cwd: join(root, workdir),
          env: { PATH: process.env["PATH"], HOME: process.env["HOME"], ...env },
          encoding: "utf8",
          timeout: 300_000,
        });
        if (run.status !== 0)
          throw new Error(`${where}: RUN ${ins.args} failed:\n${run.stdout}\n${run.stderr}`);
      } else if (ins.keyword === "ENTRYPOINT") {
        result.entrypoint = JSON.parse(ins.args) as string[];
      } else if (ins.keyword === "USER") {
        result.user = ins.args;
      } else if (ins.keyword === "EXPOSE") {
        result.exposed = ins.args.split(/\s+/).map(Number);
      }
    }
    last = result;
  });
  return last!;
}

/** The ports values.yaml gives a component. */
function chartPorts(service: string): number[] {
  const values = parseYaml(readFileSync(join(REPO_ROOT, "helm/tollgate/values.yaml"), "utf8")) as {
    components: Record<string, { ports: { port: number }[] }>;
  };
  return (values.components[service]?.ports ?? []).map((p) => p.port).sort();
}

describe.each(SERVICES)("services/%s/Dockerfile", (service) => {
  const text = readFileSync(join(REPO_ROOT, "services", service, "Dockerfile"), "utf8");
  const stages = stagesOf(parseDockerfile(text));
  const runtime = stages.at(-1)!;

  it("passes the Dockerfile linter with no finding", () => {
    const findings = validate(text).map((d) => `line ${d.range.start.line + 1}: ${d.message}`);
    expect(findings).toEqual([]);
  });

  it("builds in one stage with npm ci of this workspace only, and bundles src/main.ts", () => {
    expect(stages.length).toBeGreaterThanOrEqual(2);
    const build = stages[0]!.instructions.filter((i) => i.keyword === "RUN").map((i) => i.args);
    expect(build).toContainEqual(
      expect.stringMatching(new RegExp(`^npm ci --workspace services/${service} `)),
    );
    expect(build.join("\n")).toContain("--include-workspace-root=false");
    expect(build).toContainEqual(`npm run build --workspace services/${service}`);
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, "services", service, "package.json"), "utf8"));
    expect(pkg.scripts.build).toBe("node ../../deploy/build/bundle.mjs");
  });

  it("runs on distroless Node 20 as nonroot, with no shell step, no npm and no node_modules", () => {
    expect(runtime.from).toBe(RUNTIME_IMAGE);
    expect(runtime.instructions.filter((i) => i.keyword === "RUN")).toEqual([]);
    expect(runtime.instructions.filter((i) => i.keyword === "USER").map((i) => i.args)).toEqual(["nonroot"]);
    const copies = runtime.instructions.filter((i) => i.keyword === "COPY");
    expect(copies.length).toBeGreaterThan(0);
    for (const c of copies) {
      const [from, ...paths] = c.args.split(/\s+/);
      expect(from).toBe("--from=build");
      // Only the build's output: dist/main.mjs and what travels with it.
      for (const src of paths.slice(0, -1))
        expect(src).toMatch(new RegExp(`^/src/services/${service}/dist/`));
    }
    const entry = runtime.instructions.find((i) => i.keyword === "ENTRYPOINT");
    const argv = JSON.parse(entry!.args) as string[];
    expect(argv[0]).toBe("/nodejs/bin/node");
    expect(argv.at(-1)).toBe("/app/main.mjs");
    // Source maps in memory would cost 40-50 MB of RSS per process (the idle target is 120 MB).
    expect(argv).not.toContain("--enable-source-maps");
    // The stack and the benchmark run the bundle with exactly these flags.
    expect(imageNodeFlags(`services/${service}`)).toEqual(argv.slice(1, -1));
  });

  it("pins every base image and keeps secrets out of ENV and ARG", () => {
    for (const s of stages) {
      expect(s.from).toMatch(/^[^:@\s]+(:[\w.-]+|@sha256:[a-f0-9]{64})/);
      expect(s.from).not.toMatch(/:latest$/);
    }
    for (const ins of stages.flatMap((s) => s.instructions)) {
      if (ins.keyword === "ENV" || ins.keyword === "ARG")
        for (const pair of ins.args.split(/\s+/))
          expect(pair.split("=")[0], `line ${ins.line}`).not.toMatch(SECRETISH);
    }
  });

  it("exposes exactly the ports the chart gives it", () => {
    const exposed = runtime.instructions
      .filter((i) => i.keyword === "EXPOSE")
      .flatMap((i) => i.args.split(/\s+/).map(Number))
      .sort();
    expect(exposed).toEqual(chartPorts(service));
  });
});

describe("the images, built here and run as a stack", () => {
  const namespace = uniqueNamespace("img");
  const children: ChildProcess[] = [];
  const output: string[] = [];
  let scratch: string;
  let tokens: StackTokens;
  let nats: NatsFixture;
  let redis: RedisFixture;
  let upstream: FakeUpstream;
  const images = new Map<string, BuiltImage>();
  const grpcPorts = new Map<string, number>();
  let edgeUrl = "";
  const demoKey = /secret:\s*(\S+)/.exec(readFileSync(DEMO_CONFIG, "utf8"))?.[1] ?? "";

  /** Starts an image's ENTRYPOINT with this machine's node in place of the image's. */
  async function run(service: string, env: Record<string, string>): Promise<ChildProcess> {
    const image = images.get(service)!;
    const [node, ...args] = image.entrypoint;
    expect(node).toBe("/nodejs/bin/node");
    const child = spawn(
      process.execPath,
      args.map((a) => (a.startsWith("/") ? join(image.runtimeRoot, a) : a)),
      {
        // Only what the chart sets: no NODE_OPTIONS (so no tsx loader), no inherited settings.
        env: {
          PATH: "/usr/bin:/bin",
          ...image.env,
          // As the chart's token fallback: each service its own token, the digests of all.
          INTERNAL_TOKEN_FILE: tokens.tokenFile(service as ServiceIdentity),
          INTERNAL_PEER_TOKENS_FILE: tokens.peersFile,
          ...env,
        },
        cwd: join(image.runtimeRoot, "app"),
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    const collect = (b: Buffer) => output.push(`[${service}] ${b.toString("utf8")}`);
    child.stdout?.on("data", collect);
    child.stderr?.on("data", collect);
    children.push(child);
    return child;
  }

  async function until(what: string, check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!(await check().catch(() => false))) {
      if (Date.now() > deadline) throw new Error(`${what} within ${timeoutMs} ms\n${output.join("")}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  beforeAll(async () => {
    scratch = mkdtempSync(join(tmpdir(), "tollgate-images-"));
    tokens = writeStackTokens(scratch);
    for (const s of SERVICES) images.set(s, buildImage(s, scratch));
    [nats, redis, upstream] = await Promise.all([useNats(), useRedis(), startFakeUpstream()]);
    const config = join(scratch, "tollgate.yaml");
    writeFileSync(
      config,
      readFileSync(DEMO_CONFIG, "utf8").replace("http://127.0.0.1:18000/v1", upstream.url),
    );
    // The chart mounts the HMAC key as a file (MPP_SECRET_FILE), never an env value.
    const secretFile = join(scratch, "mpp-secret");
    writeFileSync(secretFile, `${uniqueNamespace("hmac")}-0123456789abcdef0123456789abcdef\n`);
    for (const s of SERVICES) if (s !== "api-edge") grpcPorts.set(s, await freePort());
    const common = {
      LOG_LEVEL: "info",
      GRPC_HOST: "127.0.0.1",
      METRICS_HOST: "127.0.0.1",
      METRICS_PORT: "0",
      NATS_URL: nats.url,
      NATS_NAMESPACE: namespace,
      REDIS_URL: redis.url,
      REDIS_PREFIX: `tollgate:${namespace}:`,
      TOLLGATE_CONFIG: config,
    };
    const addr = (s: string) => `127.0.0.1:${grpcPorts.get(s)}`;
    await run("auth-policy", { ...common, GRPC_PORT: String(grpcPorts.get("auth-policy")) });
    await run("metering", {
      ...common,
      GRPC_PORT: String(grpcPorts.get("metering")),
      AUTH_POLICY_ADDR: addr("auth-policy"),
    });
    await run("inference-router", { ...common, GRPC_PORT: String(grpcPorts.get("inference-router")) });
    await run("mpp-payment", {
      ...common,
      GRPC_PORT: String(grpcPorts.get("mpp-payment")),
      TEMPO_RPC_URL: "http://127.0.0.1:9/",
      MPP_SECRET_FILE: secretFile,
      MPP_RECIPIENT: "0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e",
    });
    const port = await freePort();
    edgeUrl = `http://127.0.0.1:${port}`;
    await run("api-edge", {
      LOG_LEVEL: "info",
      HOST: "127.0.0.1",
      PORT: String(port),
      METRICS_HOST: "127.0.0.1",
      METRICS_PORT: "0",
      REDIS_URL: redis.url,
      REDIS_PREFIX: `tollgate:${namespace}:`,
      AUTH_POLICY_ADDR: addr("auth-policy"),
      INFERENCE_ROUTER_ADDR: addr("inference-router"),
      MPP_PAYMENT_ADDR: addr("mpp-payment"),
      METERING_ADDR: addr("metering"),
    });
  }, 600_000);

  // The five scratch images hold each build stage's node_modules: removing them is slow on a
  // busy machine, so it runs without blocking the event loop and the hook has room for it.
  afterAll(async () => {
    await Promise.all(
      children
        .filter((c) => c.exitCode === null && c.signalCode === null)
        .map((c) => new Promise<void>((resolve) => c.once("exit", () => resolve()).kill("SIGKILL"))),
    );
    await upstream?.close();
    await nats?.stop();
    await redis?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true });
  }, 300_000);

  it("leaves only the bundle, its source map, licences and data files in each runtime image", () => {
    for (const [service, image] of images) {
      const app = join(image.runtimeRoot, "app");
      expect(readdirSync(app).sort(), service).toEqual([
        "assets",
        "main.mjs",
        "main.mjs.LEGAL.txt",
        "main.mjs.map",
      ]);
      expect(existsSync(join(image.runtimeRoot, "node_modules")), service).toBe(false);
      expect(image.user, service).toBe("nonroot");
    }
  });

  it("answers grpc.health.v1 SERVING on every gRPC service, as the kubelet's probes ask", async () => {
    for (const [service, port] of grpcPorts)
      await until(
        `${service} SERVING`,
        async () => (await checkGrpcHealth(`127.0.0.1:${port}`)) === "SERVING",
      );
  });

  it("serves /livez, /readyz, the models and a chat completion through api-edge", async () => {
    await until("api-edge /readyz", async () => (await fetch(`${edgeUrl}/readyz`)).ok);
    expect((await fetch(`${edgeUrl}/livez`)).status).toBe(200);
    const auth = { authorization: `Bearer ${demoKey}` };
    const models = await fetch(`${edgeUrl}/v1/models`, { headers: auth });
    expect(models.status).toBe(200);
    expect(((await models.json()) as { data: { id: string }[] }).data.map((m) => m.id)).toContain(
      "tollgate-mini",
    );
    const chat = await fetch(`${edgeUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({
        model: "tollgate-mini",
        max_tokens: 8,
        messages: [{ role: "user", content: "hi" }],
      }),
    });
    expect(chat.status, await chat.clone().text()).toBe(200);
    const body = (await chat.json()) as {
      choices: { message: { content: string } }[];
      usage: { completion_tokens: number };
    };
    expect(body.choices[0]?.message.content.length).toBeGreaterThan(0);
    expect(body.usage.completion_tokens).toBeGreaterThan(0);
  });

  it("stops every process cleanly on SIGTERM, as a pod deletion does", async () => {
    const exits = children.map(
      (c) =>
        new Promise<number | null>((resolve) =>
          c.exitCode !== null ? resolve(c.exitCode) : c.once("exit", (code) => resolve(code)),
        ),
    );
    for (const c of [...children].reverse()) c.kill("SIGTERM");
    expect(await Promise.all(exits)).toEqual(children.map(() => 0));
  });
});
