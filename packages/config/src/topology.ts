// Who dials whom: each service's ports, the services it calls and the environment variable that
// carries each address, and whether it uses NATS, Redis and the configuration file. The all-in-one process, the
// multi-process stack (packages/testkit/src/stack.ts, `make up`), the image test and the
// profiler read it; the chart's `components` (helm/tollgate/values.yaml) must agree with it,
// which topology.test.ts checks.

/** One port a service listens on, and the variable that moves it. */
export interface TopologyPort {
  name: "http" | "admin" | "grpc" | "health" | "metrics";
  port: number;
  env: string;
}

/** A service this one calls over gRPC. */
export interface TopologyDial {
  service: ServiceName;
  /** The variable holding the address(es), comma-separated when there are several replicas. */
  env: string;
  /** The field of the service's start() configuration that receives it. */
  option: string;
  /** Every replica is dialled (the chart's headless Service), not one Service address. */
  headless?: true;
  /** The service runs without this peer ("off" in the chart when the peer is disabled). */
  optional?: true;
}

export interface ServiceTopology {
  /** One line: what the service does. */
  summary: string;
  ports: readonly TopologyPort[];
  dials: readonly TopologyDial[];
  nats: boolean;
  redis: boolean;
  /** Reads the Tollgate configuration file (TOLLGATE_CONFIG). */
  configFile: boolean;
  /** Node flags between node and the bundle (the image's ENTRYPOINT; the stack's bundle runs). */
  nodeFlags: readonly string[];
}

/** The services, in a stable order; TOPOLOGY describes each of them and no other. */
export const SERVICE_NAMES = [
  "api-edge",
  "auth-policy",
  "inference-router",
  "metering",
  "mpp-payment",
] as const;
export type ServiceName = (typeof SERVICE_NAMES)[number];

const grpc = (n: number): TopologyPort[] => [
  { name: "grpc", port: 50050 + n, env: "GRPC_PORT" },
  { name: "health", port: 50060 + n, env: "GRPC_HEALTH_PORT" },
  { name: "metrics", port: 9050 + n, env: "METRICS_PORT" },
];

/**
 * The services' node flags (docs/performance.md, "Idle memory per service"). `--expose-gc` lets
 * a service end its start-up with one memory-reducing collection
 * (packages/kit/src/startup-memory.ts): an idle replica then holds what it uses, not what loading
 * its modules needed. That collection also shrinks the young generation, which V8 regrows only
 * slowly under load: more collections per request, about 0.2 ms more CPU per request over the
 * stack at one connection. `--min-semi-space-size=16` keeps the young generation where start-up
 * used to leave it (and where load takes it), so the request path pays nothing for it.
 * mpp-payment, which allocates little per request, goes without it, and with two V8 worker
 * threads instead of four (fewer native heaps kept), to stay below 120 MB idle.
 */
const NODE_FLAGS = ["--expose-gc", "--min-semi-space-size=16"] as const;
const PAYMENT_NODE_FLAGS = ["--expose-gc", "--v8-pool-size=2"] as const;

export const TOPOLOGY = {
  "api-edge": {
    summary: "the public HTTP door, the admin API and metrics",
    ports: [
      { name: "http", port: 8080, env: "PORT" },
      { name: "admin", port: 8081, env: "ADMIN_PORT" },
      { name: "metrics", port: 9080, env: "METRICS_PORT" },
    ],
    dials: [
      { service: "auth-policy", env: "AUTH_POLICY_ADDR", option: "authPolicyAddr" },
      {
        service: "inference-router",
        env: "INFERENCE_ROUTER_ADDR",
        option: "inferenceRouterAddr",
        headless: true,
      },
      { service: "mpp-payment", env: "MPP_PAYMENT_ADDR", option: "mppPaymentAddr", optional: true },
      { service: "metering", env: "METERING_ADDR", option: "meteringAddr" },
    ],
    nats: false,
    redis: true,
    // Read for the plans and prices its OpenAPI document shows (x-payment-info).
    configFile: true,
    nodeFlags: NODE_FLAGS,
  },
  "auth-policy": {
    summary: "Virtual Keys, accounts, policy and budgets over gRPC",
    ports: grpc(1),
    dials: [],
    nats: true,
    redis: true,
    configFile: true,
    nodeFlags: NODE_FLAGS,
  },
  "mpp-payment": {
    summary: "the paid door's payments over gRPC",
    ports: grpc(2),
    dials: [],
    nats: false,
    redis: true,
    configFile: true,
    nodeFlags: PAYMENT_NODE_FLAGS,
  },
  "inference-router": {
    summary: "upstream providers and completions over gRPC",
    ports: grpc(3),
    dials: [],
    nats: true,
    redis: false,
    configFile: true,
    nodeFlags: NODE_FLAGS,
  },
  metering: {
    summary: "usage events from JetStream and analytics over gRPC",
    ports: grpc(4),
    // Settles budget reservations with auth-policy and commits paid holds with mpp-payment
    // (connected on first use; without mpp-payment, api-edge's Commit alone charges them).
    dials: [
      { service: "auth-policy", env: "AUTH_POLICY_ADDR", option: "authPolicyAddr" },
      { service: "mpp-payment", env: "MPP_PAYMENT_ADDR", option: "mppPaymentAddr", optional: true },
    ],
    nats: true,
    redis: true,
    configFile: false,
    nodeFlags: NODE_FLAGS,
  },
} as const satisfies Record<ServiceName, ServiceTopology>;

/** The port a service listens on by default, by name; undefined when it has none of that name. */
export function portOf(service: ServiceName, name: TopologyPort["name"]): number | undefined {
  return (TOPOLOGY[service].ports as readonly TopologyPort[]).find((p) => p.name === name)?.port;
}

/**
 * The environment that tells `service` where its peers are, given each peer's address(es): one
 * variable per dial, replicas comma-separated. An optional peer with no address is left out.
 */
export function dialEnv(
  service: ServiceName,
  addresses: (peer: ServiceName) => readonly string[],
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const d of TOPOLOGY[service].dials as readonly TopologyDial[]) {
    const addrs = addresses(d.service);
    if (addrs.length === 0) {
      if (d.optional) continue;
      throw new Error(`${service} needs ${d.service} (${d.env}), which has no address`);
    }
    env[d.env] = addrs.join(",");
  }
  return env;
}

type DialsOf<S extends ServiceName> = (typeof TOPOLOGY)[S]["dials"][number];
/** The start() options that carry a service's peer addresses, typed from the topology. */
export type DialOptions<S extends ServiceName> = {
  [D in DialsOf<S> as D extends { optional: true } ? never : D["option"]]: string;
} & {
  [D in DialsOf<S> as D extends { optional: true } ? D["option"] : never]?: string;
};

/** As dialEnv, for a start() function called in process: its peer address options. */
export function dialOptions<S extends ServiceName>(
  service: S,
  address: (peer: ServiceName) => string | undefined,
): DialOptions<S> {
  const out: Record<string, string> = {};
  for (const d of TOPOLOGY[service].dials as readonly TopologyDial[]) {
    const addr = address(d.service);
    if (addr === undefined) {
      if (d.optional) continue;
      throw new Error(`${service} needs ${d.service} (${d.option}), which is not running`);
    }
    out[d.option] = addr;
  }
  return out as DialOptions<S>;
}
