// The service images: one Dockerfile, deploy/build/Dockerfile, built once per service with
// --build-arg SERVICE=<name>, checked where no container engine runs. It passes a Dockerfile
// linter (dockerfile-utils) and, for every service, the project's rules (multi-stage, `npm ci`
// of that workspace only, no workspace manifest listed by hand, a distroless nonroot runtime
// with no shell steps, pinned base images, no secrets in ENV or ARG, the chart's ports exposed,
// the topology's node flags). Then it is carried out the way `docker build` would: ARGs
// substituted, only the stages the chosen one needs, their COPY (through .dockerignore), ENV,
// WORKDIR and RUN steps in scratch folders, a stage built FROM another starting from a copy of
// it, and the five resulting "images" run as a stack with plain node: no tsx, no node_modules,
// the HMAC secret read from a file as the chart mounts it, gRPC health SERVING as the
// kubelet's probes ask it, a chat completion served end to end, and paid requests on a Tempo
// devnet, each with a new voucher whose signer mpp-payment's image recovers with the WebAssembly
// its bundle ships (deploy/build/bundle.mjs).

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
import { PaidSession } from "@tollgate/agent-client";
import { dialEnv, portOf, SERVICE_NAMES, type ServiceName, TOPOLOGY } from "@tollgate/config/topology";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/demo/fake-upstream";
import type { ServiceIdentity } from "@tollgate/kit/credentials";
import { checkGrpcHealth } from "@tollgate/kit/health";
import {
  freePort,
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type StackTokens, writeStackTokens } from "@tollgate/testkit/internal-auth";
import { DEMO_CONFIG, imageNodeFlags, REPO_ROOT } from "@tollgate/testkit/stack";
import { createTempoDevnet, DEMO_PAYER_PRIVATE_KEY, type TempoDevnet } from "@tollgate/testkit/tempo-devnet";
import { validate } from "dockerfile-utils";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";

const SERVICES = SERVICE_NAMES;
const DOCKERFILE = "deploy/build/Dockerfile";
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

/** `NAME=value` pairs of an ARG or ENV instruction (a bare name has no value). */
function pairs(args: string): [string, string | undefined][] {
  return args.split(/\s+/).map((pair) => {
    const [k, ...v] = pair.split("=");
    return [k!, v.length > 0 ? v.join("=").replace(/^"(.*)"$/, "$1") : undefined];
  });
}

/** Replaces $NAME and ${NAME}; a variable with no value is an error, as a blank SERVICE would be. */
function substitute(text: string, vars: Record<string, string>, where: string): string {
  return text.replace(/\$\{(\w+)\}|\$(\w+)/g, (_, a: string | undefined, b: string | undefined) => {
    const name = (a ?? b)!;
    const value = vars[name];
    if (value === undefined || value === "") throw new Error(`${where}: ${name} has no value`);
    return value;
  });
}

/** The global ARGs (before the first FROM) with their defaults. */
function globalArgs(instructions: Instruction[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const ins of instructions) {
    if (ins.keyword === "FROM") break;
    if (ins.keyword === "ARG") for (const [k, v] of pairs(ins.args)) if (v !== undefined) out[k] = v;
  }
  return out;
}

/**
 * The stages with `docker build --build-arg` applied: FROM lines see the global ARGs; a stage's
 * instructions see the ARGs it declares again (and, in exec-form ENTRYPOINT, nothing).
 */
function stagesOf(instructions: Instruction[], buildArgs: Record<string, string>): Stage[] {
  const global = { ...globalArgs(instructions), ...buildArgs };
  const stages: Stage[] = [];
  let scope: Record<string, string> = {};
  for (const ins of instructions) {
    const where = `${DOCKERFILE}:${ins.line}`;
    if (ins.keyword === "FROM") {
      const [from, as, name] = substitute(ins.args, global, where).split(/\s+/);
      stages.push({ from: from!, ...(as?.toUpperCase() === "AS" && name ? { name } : {}), instructions: [] });
      scope = {};
    } else if (stages.length > 0) {
      if (ins.keyword === "ARG")
        for (const [k, v] of pairs(ins.args)) {
          const value = buildArgs[k] ?? v ?? global[k];
          if (value !== undefined) scope[k] = value;
        }
      const args = ins.keyword === "ENTRYPOINT" ? ins.args : substitute(ins.args, scope, where);
      stages.at(-1)!.instructions.push({ ...ins, args });
    }
  }
  return stages;
}

/** The stage an image is, with the stages it is built FROM folded in: base image and instructions. */
function flatten(stages: Stage[], stage: Stage): Stage {
  const parent = stages.find((s) => s.name === stage.from);
  if (!parent) return stage;
  const base = flatten(stages, parent);
  return { ...stage, from: base.from, instructions: [...base.instructions, ...stage.instructions] };
}

/** The stages `docker build` runs for the last one: those it is built FROM or COPYs --from. */
function neededStages(stages: Stage[]): Set<Stage> {
  const needed = new Set<Stage>();
  const visit = (stage: Stage) => {
    if (needed.has(stage)) return;
    needed.add(stage);
    const refs = [
      stage.from,
      ...stage.instructions
        .filter((i) => i.keyword === "COPY")
        .flatMap((i) => /--from=(\S+)/.exec(i.args)?.[1] ?? []),
    ];
    for (const ref of refs) {
      const s = stages.find((x) => x.name === ref);
      if (s) visit(s);
    }
  };
  visit(stages.at(-1)!);
  return needed;
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
  /** The root of each stage that ran, by name. */
  roots: Map<string, string>;
  entrypoint: string[];
  user: string;
  exposed: number[];
  env: Record<string, string>;
}

/** Runs the Dockerfile's stages for one SERVICE here: COPY, ENV, WORKDIR and RUN, in scratch folders. */
function buildImage(service: string, scratch: string): BuiltImage {
  const stages = stagesOf(parseDockerfile(readFileSync(join(REPO_ROOT, DOCKERFILE), "utf8")), {
    SERVICE: service,
  });
  const ignored = dockerignore(readFileSync(join(REPO_ROOT, ".dockerignore"), "utf8"));
  const needed = neededStages(stages);
  const roots = new Map<string, string>();
  const built = new Map<string, BuiltImage>();
  let last: BuiltImage | undefined;
  stages.forEach((stage, index) => {
    if (!needed.has(stage)) return;
    const root = join(scratch, `${service}-stage${index}`);
    const parent = built.get(stage.from);
    if (parent) cpSync(parent.runtimeRoot, root, { recursive: true });
    mkdirSync(root, { recursive: true });
    if (stage.name) roots.set(stage.name, root);
    let workdir = parent ? ((parent as BuiltImage & { workdir?: string }).workdir ?? "/") : "/";
    const env: Record<string, string> = { ...parent?.env };
    const result: BuiltImage & { workdir?: string } = {
      runtimeRoot: root,
      roots,
      entrypoint: [...(parent?.entrypoint ?? [])],
      user: parent?.user ?? "",
      exposed: [...(parent?.exposed ?? [])],
      env,
    };
    for (const ins of stage.instructions) {
      const where = `${DOCKERFILE}:${ins.line} (SERVICE=${service})`;
      if (ins.keyword === "WORKDIR") {
        workdir = posix.resolve(workdir, ins.args);
        mkdirSync(join(root, workdir), { recursive: true });
      } else if (ins.keyword === "ENV") {
        for (const [k, v] of pairs(ins.args)) env[k] = v ?? "";
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
          // This machine's npm cache first (a docker build would have its own layer cache):
          // the lockfile pins every version and integrity, so revalidating each package with the
          // registry buys nothing and costs minutes when the registry is slow.
          env: {
            PATH: process.env["PATH"],
            HOME: process.env["HOME"],
            npm_config_prefer_offline: "true",
            ...env,
          },
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
    result.workdir = workdir;
    if (stage.name) built.set(stage.name, result);
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

const TEXT = readFileSync(join(REPO_ROOT, DOCKERFILE), "utf8");
const NODE_MAJOR = globalArgs(parseDockerfile(TEXT))["NODE_MAJOR"];

describe(DOCKERFILE, () => {
  it("passes the Dockerfile linter with no finding", () => {
    const findings = validate(TEXT).map((d) => `line ${d.range.start.line + 1}: ${d.message}`);
    expect(findings).toEqual([]);
  });

  it("is the only Dockerfile: one per service folder is gone", () => {
    for (const s of SERVICES) expect(existsSync(join(REPO_ROOT, "services", s, "Dockerfile")), s).toBe(false);
  });

  it("builds one image per service folder, the services of the topology", () => {
    const folders = readdirSync(join(REPO_ROOT, "services"), { withFileTypes: true })
      .filter((d) => d.isDirectory())
      .map((d) => d.name)
      .sort();
    expect(folders).toEqual(SERVICES);
  });

  it("names the Node major once, in one ARG both stages use", () => {
    expect(NODE_MAJOR).toMatch(/^\d+$/);
    expect(TEXT.match(/^ARG NODE_MAJOR\b.*$/gm)).toHaveLength(1);
    expect(TEXT).not.toMatch(/node:\d|nodejs\d/);
  });

  it("lists no workspace manifest by hand: a new package needs no edit here", () => {
    expect(TEXT).not.toMatch(/COPY\s+(packages|services)\/[^\s$]+\/package\.json/);
  });

  it("refuses a build without SERVICE", () => {
    expect(() => stagesOf(parseDockerfile(TEXT), {})).toThrow(/SERVICE has no value/);
  });
});

describe.each(SERVICES)(`${DOCKERFILE} --build-arg SERVICE=%s`, (service) => {
  const stages = stagesOf(parseDockerfile(TEXT), { SERVICE: service });
  const runtime = flatten(stages, stages.at(-1)!);
  const ports = (stage: Stage) =>
    stage.instructions
      .filter((i) => i.keyword === "EXPOSE")
      .flatMap((i) => i.args.split(/\s+/).map(Number))
      .sort();

  it("builds in one stage with npm ci of this workspace only, and bundles src/main.ts", () => {
    expect(stages.length).toBeGreaterThanOrEqual(2);
    const buildStage = stages.find((s) => s.name === "build")!;
    const build = buildStage.instructions.filter((i) => i.keyword === "RUN").map((i) => i.args);
    expect(build).toContainEqual(
      expect.stringMatching(new RegExp(`^npm ci --workspace services/${service} `)),
    );
    expect(build.join("\n")).toContain("--include-workspace-root=false");
    expect(build).toContainEqual(`npm run build --workspace services/${service}`);
    const pkg = JSON.parse(readFileSync(join(REPO_ROOT, "services", service, "package.json"), "utf8"));
    expect(pkg.scripts.build).toBe("node ../../deploy/build/bundle.mjs");
  });

  it(`runs on distroless Node ${NODE_MAJOR} as nonroot, with no shell step, no npm and no node_modules`, () => {
    expect(runtime.from).toBe(`gcr.io/distroless/nodejs${NODE_MAJOR}-debian12:nonroot`);
    expect(stages.find((s) => s.name === "build")?.from).toBe(`node:${NODE_MAJOR}-bookworm-slim`);
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
    const entry = runtime.instructions.filter((i) => i.keyword === "ENTRYPOINT").at(-1);
    const argv = JSON.parse(entry!.args) as string[];
    expect(argv[0]).toBe("/nodejs/bin/node");
    expect(argv.at(-1)).toBe("/app/main.mjs");
    // Source maps in memory would cost 40-50 MB of RSS per process (the idle target is 120 MB).
    expect(argv).not.toContain("--enable-source-maps");
    // The topology's flags, which the stack and the benchmark run the bundle with.
    expect(argv.slice(1, -1)).toEqual(TOPOLOGY[service].nodeFlags);
    expect(imageNodeFlags(`services/${service}`)).toEqual(argv.slice(1, -1));
  });

  it("pins every base image and keeps secrets out of ENV and ARG", () => {
    for (const s of stages) {
      if (stages.some((x) => x.name === s.from)) continue;
      expect(s.from).toMatch(/^[^:@\s]+(:[\w.-]+|@sha256:[a-f0-9]{64})/);
      expect(s.from).not.toMatch(/:latest$/);
    }
    for (const ins of parseDockerfile(TEXT)) {
      if (ins.keyword === "ENV" || ins.keyword === "ARG")
        for (const [k] of pairs(ins.args)) expect(k, `line ${ins.line}`).not.toMatch(SECRETISH);
    }
  });

  it("exposes exactly the ports the chart and the topology give it", () => {
    expect(ports(runtime)).toEqual(chartPorts(service));
    expect(ports(runtime)).toEqual(TOPOLOGY[service].ports.map((p) => p.port).sort());
  });
});

describe("the images, built here and run as a stack", () => {
  const namespace = uniqueNamespace("img");
  const children: ChildProcess[] = [];
  const serviceOf = new Map<ChildProcess, string>();
  const output: string[] = [];
  let scratch: string;
  let tokens: StackTokens;
  let nats: NatsFixture;
  let redis: RedisFixture;
  let upstream: FakeUpstream;
  let devnet: TempoDevnet;
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
    serviceOf.set(child, service);
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
    [nats, redis, upstream, devnet] = await Promise.all([
      useNats(),
      useRedis(),
      startFakeUpstream(),
      createTempoDevnet(),
    ]);
    const config = join(scratch, "tollgate.yaml");
    writeFileSync(
      config,
      readFileSync(DEMO_CONFIG, "utf8").replace("http://127.0.0.1:18000/v1", upstream.url),
    );
    // The chart mounts the HMAC key as a file (MPP_SECRET_FILE), never an env value.
    const secretFile = join(scratch, "mpp-secret");
    writeFileSync(secretFile, `${uniqueNamespace("hmac")}-0123456789abcdef0123456789abcdef\n`);
    // Each image gets what the chart gives its pod: its own port, NATS, Redis and the
    // configuration file only where the topology says it uses them, and its peers' addresses
    // in the variables the topology names.
    const addresses = new Map<ServiceName, string>();
    for (const s of SERVICES) addresses.set(s, `127.0.0.1:${await freePort()}`);
    const portOfAddr = (s: ServiceName) => addresses.get(s)!.split(":")[1]!;
    const extra: Partial<Record<ServiceName, Record<string, string>>> = {
      "mpp-payment": {
        TEMPO_RPC_URL: devnet.url,
        MPP_SECRET_FILE: secretFile,
        MPP_RECIPIENT: "0x3E317d4640c59d5c81b4084c3f9EFDdC5C735B8e",
      },
    };
    // Peers first, as a rollout that waits for readiness would.
    const order: ServiceName[] = [];
    const visit = (s: ServiceName) => {
      if (order.includes(s)) return;
      for (const d of TOPOLOGY[s].dials) visit(d.service);
      order.push(s);
    };
    for (const s of SERVICES) visit(s);
    for (const s of order) {
      const t = TOPOLOGY[s];
      const grpc = portOf(s, "grpc") !== undefined;
      if (grpc) grpcPorts.set(s, Number(portOfAddr(s)));
      await run(s, {
        LOG_LEVEL: "info",
        ...(grpc
          ? { GRPC_HOST: "127.0.0.1", GRPC_PORT: portOfAddr(s) }
          : { HOST: "127.0.0.1", PORT: portOfAddr(s) }),
        METRICS_HOST: "127.0.0.1",
        METRICS_PORT: "0",
        ...(t.nats ? { NATS_URL: nats.url, NATS_NAMESPACE: namespace } : {}),
        ...(t.redis ? { REDIS_URL: redis.url, REDIS_PREFIX: `tollgate:${namespace}:` } : {}),
        ...(t.configFile ? { TOLLGATE_CONFIG: config } : {}),
        ...dialEnv(s, (peer) => [addresses.get(peer)!]),
        ...extra[s],
      });
    }
    edgeUrl = `http://${addresses.get("api-edge")}`;
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
    await devnet?.close();
    await nats?.stop();
    await redis?.stop();
    if (scratch) await rm(scratch, { recursive: true, force: true, maxRetries: 5 });
  }, 300_000);

  it("gives npm ci every workspace manifest, though the Dockerfile names none", () => {
    const workspaces = ["packages", "services"].flatMap((top) =>
      readdirSync(join(REPO_ROOT, top))
        .filter((d) => existsSync(join(REPO_ROOT, top, d, "package.json")))
        .map((d) => `${top}/${d}`),
    );
    for (const [service, image] of images) {
      const build = image.roots.get("build")!;
      for (const w of workspaces)
        expect(existsSync(join(build, "src", w, "package.json")), `${service}: ${w}`).toBe(true);
      expect(
        existsSync(join(build, "src", "services", service, "node_modules")) ||
          existsSync(join(build, "src", "node_modules")),
        service,
      ).toBe(true);
    }
  });

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

  it("serves paid requests with a new voucher each: mpp-payment's image recovers every signer with its bundled WebAssembly", async () => {
    // The unmodified mppx session manager signs a new, higher voucher for every request; each
    // one's signer is recovered (services/mpp-payment/src/domain/vouchers.ts) by libsecp256k1 in
    // WebAssembly, which the bundle loads from dist/assets/ on the first recovery.
    const session = new PaidSession({
      url: edgeUrl,
      privateKey: DEMO_PAYER_PRIVATE_KEY,
      rpcUrl: devnet.url,
      voucherEachRequest: true,
    });
    const body = {
      plan: "Starter",
      model_optimization: true,
      max_tokens: 8,
      messages: [{ role: "user", content: "hi" }],
    };
    const answers = [];
    for (let i = 0; i < 3; i++) answers.push(await session.chat(body));
    expect(answers.map((a) => [a.status, a.voucher])).toEqual([
      [200, "opened"],
      [200, "raised"],
      [200, "raised"],
    ]);
    const spent = answers.map((a) => BigInt(a.receipt.spent));
    expect(spent[0]).toBeGreaterThan(0n);
    expect(spent[1]).toBeGreaterThan(spent[0]!);
    expect(spent[2]).toBeGreaterThan(spent[1]!);
  });

  it("stops every process cleanly on SIGTERM, as a pod deletion does", async () => {
    const exits = children.map(
      (c) =>
        new Promise<string>((resolve) => {
          const said = (code: number | null, signal: NodeJS.Signals | null) =>
            resolve(`${serviceOf.get(c)}: ${code ?? signal}`);
          if (c.exitCode !== null || c.signalCode !== null) said(c.exitCode, c.signalCode);
          else c.once("exit", said);
        }),
    );
    for (const c of [...children].reverse()) c.kill("SIGTERM");
    // On a failure, what the processes printed tells which step of whose stop failed.
    expect(await Promise.all(exits), output.join("")).toEqual(children.map((c) => `${serviceOf.get(c)}: 0`));
  });
});
