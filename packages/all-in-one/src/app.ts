import { randomBytes } from "node:crypto";
import { start as startApiEdge } from "@tollgate/api-edge";
import { start as startAuthPolicy } from "@tollgate/auth-policy";
import { type GatewayConfig, loadGatewayConfig } from "@tollgate/config";
import { dialOptions, type ServiceName } from "@tollgate/config/topology";
import { type FakeUpstream, startFakeUpstream } from "@tollgate/demo/fake-upstream";
import { createTempoDevnet, DEMO_PAYEE_PRIVATE_KEY, type TempoDevnet } from "@tollgate/demo/tempo-devnet";
import { start as startInferenceRouter } from "@tollgate/inference-router";
import { upstreamKeysFrom } from "@tollgate/inference-router/config";
import { createMemoryBus, type EventBus } from "@tollgate/kit/bus";
import { type InternalAuth, inProcessAuth, type ServiceIdentity } from "@tollgate/kit/credentials";
import { inProcessClient } from "@tollgate/kit/in-process";
import { createLogger } from "@tollgate/kit/log";
import { createMetrics, type MetricsServer, mergeMetrics, serveMetrics } from "@tollgate/kit/metrics";
import { type StopDeadline, stopInOrder } from "@tollgate/kit/shutdown";
import { start as startMetering } from "@tollgate/metering";
import { start as startMppPayment } from "@tollgate/mpp-payment";
import type { DestinationStream } from "pino";
import { type AllInOneConfig, DEMO_CONFIG_PATH } from "./config.js";

/** A running all-in-one gateway. */
export interface AllInOne {
  /** Base URL of the public port, e.g. http://127.0.0.1:8080. */
  url: string;
  port: number;
  /** The in-process credentials of one service, for a test that calls a service directly. */
  internalAuth(name: ServiceIdentity): InternalAuth;
  gateway: GatewayConfig;
  /**
   * The bundled demo configuration's development key, when the running configuration holds it
   * (see demoKeyOf); never a key of any other configuration.
   */
  demoKey?: string;
  /** The bundled fake upstream, in demo mode. */
  upstream?: FakeUpstream;
  /** The bundled Tempo devnet, when no TEMPO_RPC_URL was given. */
  devnet?: TempoDevnet;
  /** The chain the paid door settles on, when the paid door runs. */
  tempoRpcUrl?: string;
  /** metering's gRPC address (usage analytics). */
  meteringAddr: string;
  /** URL of the merged Prometheus endpoint of all five services, when it runs. */
  metricsUrl?: string;
  stop(deadline?: StopDeadline): Promise<void>;
}

const LOOPBACK = "127.0.0.1";

/** The clear-text key secrets of a configuration, in the order it lists them. */
const clearSecrets = (g: GatewayConfig): string[] =>
  g.accounts.flatMap((a) =>
    a.connections.flatMap((c) => c.keys.flatMap((k) => (k.secret ? [k.secret] : []))),
  );

/**
 * The one key the banner may print: the development key of the bundled demo configuration
 * (deploy/config/tollgate.yaml, its first clear-text key, read from that file so it is written
 * down once), when `gateway` holds it, as the demo and copies of it do. Any other key is an
 * operator's Virtual Key, which never reaches the process's output (docs/contract.md,
 * "Authentication": secrets never reach a log line): with any other configuration there is none.
 */
export function demoKeyOf(gateway: GatewayConfig): string | undefined {
  const secrets = clearSecrets(gateway);
  if (secrets.length === 0) return undefined;
  let demoKey: string | undefined;
  try {
    demoKey = clearSecrets(loadGatewayConfig(DEMO_CONFIG_PATH))[0];
  } catch {
    // No bundled demo configuration beside this build: no key is the demo's.
    return undefined;
  }
  return demoKey !== undefined && secrets.includes(demoKey) ? demoKey : undefined;
}

/**
 * Starts all five services in this process (docs/architecture.md, "Three ways to run it"): the same
 * start() functions the standalone processes call. The services call one another in process,
 * through the same clients and handlers as over gRPC (kit's inProcessClient), with each caller's
 * identity checked against the callee's access table; each still serves its loopback gRPC port
 * for what calls it from outside (the admin API's usage reports, tests). Without NATS_URL
 * the usage bus is in memory; without REDIS_URL the stores are; without TOLLGATE_CONFIG the
 * demo configuration runs against the bundled fake upstream.
 */
export async function startAllInOne(cfg: AllInOneConfig, destination?: DestinationStream): Promise<AllInOne> {
  const logger = (service: string) =>
    createLogger({ service, level: cfg.logLevel, ...(destination ? { destination } : {}) });
  let gateway = loadGatewayConfig(cfg.configPath ?? DEMO_CONFIG_PATH);
  let upstream: FakeUpstream | undefined;
  if (!cfg.configPath) {
    // No recording: the demo keeps no request body, header or key once it has answered.
    upstream = await startFakeUpstream({ host: LOOPBACK, port: 0, record: false });
    gateway = { ...gateway, upstreams: gateway.upstreams.map((u) => ({ ...u, baseUrl: upstream!.url })) };
  }
  const bus: EventBus | undefined = cfg.natsUrl ? undefined : createMemoryBus();
  const deps = bus ? { bus } : {};
  // A Redis or NATS that does not answer fails the start at once, and main.ts says what to start
  // (banner.ts): a person at a terminal is better told than kept waiting.
  const nats = cfg.natsUrl
    ? { natsUrl: cfg.natsUrl, natsNamespace: cfg.natsNamespace, waitForDependencies: false }
    : {};
  const redis = cfg.redisUrl
    ? { redisUrl: cfg.redisUrl, redisPrefix: cfg.redisPrefix, waitForDependencies: false }
    : {};
  // One registry per service, without the process metrics, which the process registry holds
  // once: merged, they serve one endpoint with no metric name defined twice.
  const registries = {
    process: createMetrics("all-in-one"),
    metering: createMetrics("metering", { processMetrics: false }),
    payment: createMetrics("mpp-payment", { processMetrics: false }),
    auth: createMetrics("auth-policy", { processMetrics: false }),
    router: createMetrics("inference-router", { processMetrics: false }),
    edge: createMetrics("api-edge", { processMetrics: false }),
  };
  // Every service calls the others with its own throw-away token, known only to this process
  // (docs/kubernetes.md, "Internal authentication"): the loopback ports refuse anyone else on the machine.
  const trust = inProcessAuth();
  // Who dials whom is packages/config/src/topology.ts: each service's start() gets the loopback
  // address of every peer that already runs, in the option the topology names.
  const running = new Map<ServiceName, { port: number }>();
  const peer = (name: ServiceName) => {
    const s = running.get(name);
    return s ? `${LOOPBACK}:${s.port}` : undefined;
  };
  const auth = await startAuthPolicy(
    { grpcHost: LOOPBACK, grpcPort: 0, internalAuth: trust["auth-policy"], gateway, ...redis, ...nats },
    logger("auth-policy"),
    { metrics: registries.auth },
  );
  running.set("auth-policy", auth);
  // The paid door runs when the configuration has plans; without them its route does not exist.
  const paidDoor = gateway.plans !== undefined;
  const devnet =
    cfg.tempoRpcUrl || !paidDoor
      ? undefined
      : await createTempoDevnet({ host: LOOPBACK, port: cfg.tempoDevnetPort });
  const tempoRpcUrl = cfg.tempoRpcUrl ?? devnet?.url;
  const payeeKey = cfg.mppPayeeKey ?? (devnet ? DEMO_PAYEE_PRIVATE_KEY : undefined);
  const payment =
    paidDoor && tempoRpcUrl
      ? await startMppPayment(
          {
            grpcHost: LOOPBACK,
            grpcPort: 0,
            internalAuth: trust["mpp-payment"],
            gateway,
            ...redis,
            // One process, one replica: a per-process secret is enough when none is configured.
            secret: cfg.mppSecret ?? randomBytes(32).toString("hex"),
            tempoRpcUrl,
            ...(payeeKey ? { payeeKey } : {}),
          },
          logger("mpp-payment"),
          { metrics: registries.payment },
        )
      : undefined;
  if (payment) running.set("mpp-payment", payment);
  // metering settles budget reservations with auth-policy and commits paid holds with
  // mpp-payment (docs/money.md, "Paid door: the commit after the answer"), so both start first.
  const metering = await startMetering(
    {
      grpcHost: LOOPBACK,
      grpcPort: 0,
      internalAuth: trust.metering,
      ...nats,
      ...redis,
      ...dialOptions("metering", peer),
    },
    logger("metering"),
    {
      ...deps,
      metrics: registries.metering,
      authPolicy: inProcessClient(auth.inProcess, "metering"),
      ...(payment ? { mppPayment: inProcessClient(payment.inProcess, "metering") } : {}),
    },
  );
  running.set("metering", metering);
  const router = await startInferenceRouter(
    {
      grpcHost: LOOPBACK,
      grpcPort: 0,
      internalAuth: trust["inference-router"],
      gateway,
      upstreamKeys: upstreamKeysFrom(gateway, cfg.env),
      shutdownTimeoutMs: cfg.shutdownTimeoutMs,
      ...nats,
    },
    logger("inference-router"),
    { ...deps, metrics: registries.router },
  );
  running.set("inference-router", router);
  const edge = await startApiEdge(
    {
      host: cfg.host,
      port: cfg.port,
      internalAuth: trust["api-edge"],
      ...dialOptions("api-edge", peer),
      ...(cfg.limits ? { limits: cfg.limits } : {}),
      offer: gateway,
      ...redis,
      ...(cfg.responseItemsTtlMs !== undefined ? { responseItemsTtlMs: cfg.responseItemsTtlMs } : {}),
      ...(cfg.adminToken
        ? {
            admin: {
              host: LOOPBACK,
              port: cfg.adminPort ?? 8081,
              token: cfg.adminToken,
              meteringAddr: `${LOOPBACK}:${metering.port}`,
            },
          }
        : {}),
    },
    logger("api-edge"),
    {
      metrics: registries.edge,
      clients: {
        auth: inProcessClient(auth.inProcess, "api-edge"),
        inference: inProcessClient(router.inProcess, "api-edge"),
        ...(payment ? { payment: inProcessClient(payment.inProcess, "api-edge") } : {}),
        metering: inProcessClient(metering.inProcess, "api-edge"),
      },
    },
  );
  let metricsServer: MetricsServer | undefined;
  // Front to back: stop taking requests, finish in-flight work, then the consumers.
  const stop = (deadline?: StopDeadline) =>
    stopInOrder([
      () => edge.stop(deadline),
      () => router.stop(deadline),
      () => metering.stop(deadline),
      // After metering, which settles reservations and commits paid holds with them while it drains.
      () => payment?.stop(deadline),
      () => auth.stop(),
      () => bus?.close(),
      () => upstream?.close(),
      () => devnet?.close(),
      () => metricsServer?.stop(),
    ]);
  if (cfg.metricsPort !== undefined) {
    try {
      const merged = mergeMetrics(Object.values(registries));
      metricsServer = await serveMetrics(merged, cfg.metricsHost ?? LOOPBACK, cfg.metricsPort);
    } catch (err) {
      await stop().catch(() => {});
      throw err;
    }
  }
  const demoKey = demoKeyOf(gateway);
  const urlHost = (h: string) => {
    const name = h === "0.0.0.0" || h === "::" ? LOOPBACK : h;
    return name.includes(":") ? `[${name}]` : name;
  };
  return {
    url: `http://${urlHost(cfg.host)}:${edge.port}`,
    port: edge.port,
    meteringAddr: `${LOOPBACK}:${metering.port}`,
    internalAuth: (name: ServiceIdentity) => trust[name],
    ...(metricsServer
      ? { metricsUrl: `http://${urlHost(cfg.metricsHost ?? LOOPBACK)}:${metricsServer.port}/metrics` }
      : {}),
    gateway,
    ...(demoKey ? { demoKey } : {}),
    ...(upstream ? { upstream } : {}),
    ...(devnet ? { devnet } : {}),
    ...(tempoRpcUrl ? { tempoRpcUrl } : {}),
    stop,
  };
}
