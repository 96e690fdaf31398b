import { connect as tcpConnect } from "node:net";
import { fileURLToPath } from "node:url";
import { checkGrpcHealth } from "@tollgate/kit/health";
import {
  freePort,
  type NatsFixture,
  privateNats,
  privateRedis,
  type RedisFixture,
  type ServerFixture,
  uniqueNamespace,
} from "@tollgate/testkit/fixtures";
import { configFile, type MainRun, oneKeyConfig, runMain, stopMains } from "@tollgate/testkit/main-process";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";

/**
 * How a standalone service starts (docs/operations.md, "Starting before Redis or NATS"): a Redis
 * or NATS that does not answer yet is waited for, the process alive and saying what it waits
 * for (by address, never a credential), and it serves once they answer; a bad configuration
 * exits 1 with one line and no stack trace. Each service runs as its image runs it: its main.ts.
 */
const SERVICES = ["api-edge", "auth-policy", "inference-router", "metering", "mpp-payment"] as const;
const mainOf = (service: string) =>
  fileURLToPath(new URL(`../../../services/${service}/src/main.ts`, import.meta.url));
const NATS_PASSWORD = "nats-pw-never-printed-0123456789";

type Run = MainRun;

/** Starts `service` from its main.ts with only `env` (internal auth off unless it says). */
const run = (service: string, env: Record<string, string>): Run =>
  runMain(mainOf(service), { INTERNAL_AUTH: "off", ...env });

afterEach(stopMains);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Whether something accepts connections on 127.0.0.1:`port`. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: "127.0.0.1", port }, () => {
      socket.destroy();
      resolve(true);
    });
    socket.on("error", () => resolve(false));
    socket.setTimeout(500, () => socket.destroy());
    socket.once("close", () => resolve(false));
  });
}

/**
 * Takes a private server down until `until` resolves: resolves once it is down, with the
 * promise of its return (wrapped: an async function's result would wait for it).
 */
async function takeDown(server: ServerFixture, until: Promise<unknown>): Promise<{ back: Promise<void> }> {
  const port = Number(new URL(server.url).port);
  const back = server.restart({ until });
  while (await listening(port)) await sleep(20);
  return { back };
}

/** Resolves once the process has logged `n` lines that match, for at most 15 s. */
async function logged(r: Run, match: (line: Record<string, unknown>) => boolean, n = 1): Promise<void> {
  const deadline = Date.now() + 15_000;
  while (linesOf(r).filter(match).length < n) {
    if (Date.now() > deadline) throw new Error(`not logged: ${r.stdout()}`);
    await sleep(50);
  }
}

/** Asks the health port until it answers SERVING, for at most `forMs`. */
async function servingWithin(port: number, forMs: number): Promise<string> {
  const deadline = Date.now() + forMs;
  let last = "no answer";
  while (Date.now() < deadline) {
    last = await checkGrpcHealth(`127.0.0.1:${port}`, "", 1_000).catch((err: Error) => err.message);
    if (last === "SERVING") return last;
    await sleep(200);
  }
  return last;
}

/** Each log line (stdout) the process wrote, parsed. */
const linesOf = (r: Run) =>
  r
    .stdout()
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);

const CONFIG = oneKeyConfig("tg_startup_key_0123456789abcdef0123");

describe("a standalone service started before its Redis and NATS", () => {
  let nats: NatsFixture;
  let redis: RedisFixture;

  beforeAll(async () => {
    nats = await privateNats({
      user: "svc",
      pass: NATS_PASSWORD,
      permissions: { publish: [">"], subscribe: [">"] },
    });
    redis = await privateRedis();
  });

  afterAll(async () => {
    await nats?.stop();
    await redis?.stop();
  });

  it("auth-policy waits alive, names each by address only, and serves once they answer", async () => {
    const redisAt = `redis at 127.0.0.1:${new URL(redis.url).port}`;
    const natsAt = `nats at 127.0.0.1:${new URL(nats.url).port}`;
    let ap: Run | undefined;
    const waitedFor = (dependency: string) => async () => {
      while (!ap) await sleep(50);
      // Two tries each: the process went on waiting after the first.
      await logged(ap, (l) => l.dependency === dependency, 2);
    };
    const { back: redisBack } = await takeDown(redis, waitedFor(redisAt)());
    const { back: natsBack } = await takeDown(nats, waitedFor(natsAt)());
    const healthPort = await freePort();
    ap = run("auth-policy", {
      TOLLGATE_CONFIG: configFile(CONFIG),
      GRPC_PORT: "0",
      GRPC_HEALTH_PORT: String(healthPort),
      METRICS_PORT: "0",
      REDIS_URL: redis.url,
      REDIS_PREFIX: `${uniqueNamespace("start")}:`,
      NATS_URL: nats.url,
      NATS_NAMESPACE: uniqueNamespace("start"),
    });
    await Promise.all([redisBack, natsBack]);
    expect(await servingWithin(healthPort, 15_000)).toBe("SERVING");
    expect(ap.child.exitCode).toBeNull();
    const waits = linesOf(ap).filter((l) => String(l.msg).endsWith("unreachable at start; waiting for it"));
    expect(waits.some((l) => l.dependency === redisAt)).toBe(true);
    expect(waits.some((l) => l.dependency === natsAt)).toBe(true);
    // Bounded backoff: a few lines for a few seconds, not one per reconnect of the client.
    expect(waits.length).toBeLessThan(20);
    expect(ap.stdout() + ap.stderr()).not.toContain(NATS_PASSWORD);
    expect(ap.stderr()).not.toMatch(/^\s+at /m);
  });

  it("metering waits for NATS, creates its stream once it answers, and serves", async () => {
    const natsAt = `nats at 127.0.0.1:${new URL(nats.url).port}`;
    let metering: Run | undefined;
    const { back: natsBack } = await takeDown(
      nats,
      (async () => {
        while (!metering) await sleep(50);
        await logged(metering, (l) => l.dependency === natsAt, 2);
      })(),
    );
    const healthPort = await freePort();
    metering = run("metering", {
      GRPC_PORT: "0",
      GRPC_HEALTH_PORT: String(healthPort),
      METRICS_PORT: "0",
      REDIS_URL: redis.url,
      REDIS_PREFIX: `${uniqueNamespace("start")}:`,
      NATS_URL: nats.url,
      NATS_NAMESPACE: uniqueNamespace("start"),
    });
    await natsBack;
    expect(await servingWithin(healthPort, 15_000)).toBe("SERVING");
    expect(metering.child.exitCode).toBeNull();
    expect(metering.stdout() + metering.stderr()).not.toContain(NATS_PASSWORD);
  });
});

describe("a standalone service with a bad configuration", () => {
  it.each(SERVICES)("%s exits 1 with one line naming the bad variable, no stack trace", async (service) => {
    const r = run(service, { LOG_LEVEL: "loud", TOLLGATE_CONFIG: configFile(CONFIG) });
    expect(await r.exited).toBe(1);
    const lines = r.stderr().trimEnd().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^${service}: invalid configuration: .*LOG_LEVEL`));
  });

  it("names a configuration file that is not valid YAML, in one line", async () => {
    const r = run("auth-policy", { TOLLGATE_CONFIG: configFile("models: [\n  - {id: \n") });
    expect(await r.exited).toBe(1);
    const lines = r.stderr().trimEnd().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^auth-policy: invalid configuration: .*tollgate\.yaml: not valid YAML/);
  });
});
