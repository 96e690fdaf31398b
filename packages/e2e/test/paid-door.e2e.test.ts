import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { natsNames } from "@tollgate/proto/subjects";
import { startFakeUpstream } from "@tollgate/testkit/fake-upstream";
import { freePort, uniqueNamespace, useNats, useRedis } from "@tollgate/testkit/fixtures";
import { DEMO_CONFIG, startStack } from "@tollgate/testkit/stack";
import { type SpawnedGateway, spawnAllInOne } from "./gateways.js";
import type { PaidTarget } from "./paid-door-kit.js";
import { describePaidDoor } from "./paid-door-scenarios.js";

/**
 * The all-in-one process spawned exactly as `npm start` runs it, with free PORT and
 * TEMPO_DEVNET_PORT. The one change to its embedded defaults: TOLLGATE_CONFIG is the demo
 * configuration with its upstream pointed at a fake upstream in this process (the bundled one
 * lives inside the child, out of reach), so "no model ran" is the upstream's own request count.
 */
async function startAllInOneProcess(): Promise<PaidTarget> {
  const upstream = await startFakeUpstream({ record: true });
  const dir = mkdtempSync(join(tmpdir(), "tollgate-paid-door-"));
  const configPath = join(dir, "tollgate.yaml");
  writeFileSync(
    configPath,
    readFileSync(DEMO_CONFIG, "utf8").replace("http://127.0.0.1:18000/v1", upstream.url),
  );
  const devnetPort = await freePort();
  let gateway: SpawnedGateway;
  try {
    gateway = await spawnAllInOne({ TEMPO_DEVNET_PORT: String(devnetPort), TOLLGATE_CONFIG: configPath });
  } catch (err) {
    await upstream.close();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const stop = async () => {
    await gateway.stop();
    await upstream.close();
    rmSync(dir, { recursive: true, force: true });
  };
  const completions = () =>
    upstream.requests.filter((r) => r.method === "POST" && r.path === "/v1/chat/completions").length;
  return {
    url: `http://127.0.0.1:${gateway.port}`,
    rpcUrl: `http://127.0.0.1:${devnetPort}`,
    modelRuns: async () => completions(),
    // Logs go to stdout; the banner (the demo key, on purpose) goes to stderr, and it must not
    // carry payment material either.
    logs: () => `${gateway.stdout()}\n${gateway.stderr()}`,
    stop,
  };
}

/**
 * The multi-process stack on real NATS and Redis, in its own namespace. A model run is a usage
 * event stored in this run's JetStream stream (the router publishes one per served request
 * before it answers).
 */
async function startMultiProcessStack(): Promise<PaidTarget> {
  const namespace = uniqueNamespace("paid");
  const nats = await useNats();
  const redis = await useRedis();
  const lines: string[] = [];
  const stack = await startStack({
    natsUrl: nats.url,
    redisUrl: redis.url,
    namespace,
    routers: 2,
    // The devnet is the chain, not the gateway: its own banner names the demo accounts by design.
    onLine: (service, line) => {
      if (service !== "tempo-devnet") lines.push(`${service}: ${line}`);
    },
  }).catch(async (err: unknown) => {
    await Promise.all([nats.stop(), redis.stop()]);
    throw err;
  });
  const nc = await connect({ servers: nats.url });
  const jsm = await jetstreamManager(nc);
  const stream = natsNames(namespace).usageStream;
  return {
    url: stack.url,
    rpcUrl: stack.tempoRpcUrl,
    modelRuns: async () => {
      try {
        return (await jsm.streams.info(stream)).state.messages;
      } catch (err) {
        // The stream is created with the first publisher; none yet means no usage yet.
        if (/stream not found/i.test(String(err))) return 0;
        throw err;
      }
    },
    logs: () => lines.join("\n"),
    stop: async () => {
      await nc.close();
      await stack.stop();
      await Promise.all([nats.stop(), redis.stop()]);
    },
  };
}

describePaidDoor("paid door: all-in-one process (npm start)", startAllInOneProcess);
describePaidDoor("paid door: multi-process stack on real NATS and Redis", startMultiProcessStack);
