// The ports `make up` (deploy/local/up.ts) listens on: the chart's (packages/config/src/topology.ts)
// and the demo's by default, each movable by a variable (docs/configuration.md, "`make up`"), so
// that a second stack, or anything else already on a default port, can share the machine.
import { createServer } from "node:net";
import { portOf, type ServiceName } from "@tollgate/config/topology";

/** Every port of the stack `make up` starts, as startStack (./stack.ts) takes them. */
export interface UpPorts {
  port: number;
  adminPort: number;
  upstreamPort: number;
  devnetPort: number;
  grpcPorts: { auth: number; metering: number; payment: number; routers: number[] };
  /** First of the consecutive metrics ports, one per process; undefined: free ports. */
  metricsPortBase: number | undefined;
}

/** The variables `make up` reads, with the default each stands for. */
export const UP_PORT_VARIABLES = {
  PORT: () => String(portOf("api-edge", "http")),
  ADMIN_PORT: () => String(portOf("api-edge", "admin")),
  FAKE_UPSTREAM_PORT: () => "18000",
  TEMPO_DEVNET_PORT: () => "18545",
  AUTH_POLICY_GRPC_PORT: () => String(grpc("auth-policy")),
  MPP_PAYMENT_GRPC_PORT: () => String(grpc("mpp-payment")),
  METERING_GRPC_PORT: () => String(grpc("metering")),
  // The stack serves no separate health port, so the second router takes the first one's.
  INFERENCE_ROUTER_GRPC_PORTS: () => `${grpc("inference-router")},${portOf("inference-router", "health")}`,
  METRICS_PORT_BASE: () => "",
} as const;

function grpc(service: ServiceName): number {
  return portOf(service, "grpc")!;
}

/**
 * Reads the ports from `env`; every problem is reported at once. Two routers take two ports in
 * INFERENCE_ROUTER_GRPC_PORTS.
 */
export function upPorts(env: NodeJS.ProcessEnv, routers = 2): UpPorts {
  const problems: string[] = [];
  const read = (name: keyof typeof UP_PORT_VARIABLES): number[] => {
    const raw = env[name] === undefined || env[name] === "" ? UP_PORT_VARIABLES[name]() : env[name];
    if (raw === "") return [];
    const ports = raw.split(",").map((s) => Number(s.trim()));
    if (ports.some((p) => !Number.isInteger(p) || p < 1 || p > 65535))
      problems.push(
        `${name}=${raw}: expected ${name.endsWith("PORTS") ? "ports" : "a port"} from 1 to 65535`,
      );
    return ports;
  };
  const one = (name: keyof typeof UP_PORT_VARIABLES) => read(name)[0] ?? 0;
  const routerPorts = read("INFERENCE_ROUTER_GRPC_PORTS");
  if (routerPorts.length !== routers)
    problems.push(`INFERENCE_ROUTER_GRPC_PORTS: expected ${routers} comma-separated ports, one per router`);
  const ports: UpPorts = {
    port: one("PORT"),
    adminPort: one("ADMIN_PORT"),
    upstreamPort: one("FAKE_UPSTREAM_PORT"),
    devnetPort: one("TEMPO_DEVNET_PORT"),
    grpcPorts: {
      auth: one("AUTH_POLICY_GRPC_PORT"),
      metering: one("METERING_GRPC_PORT"),
      payment: one("MPP_PAYMENT_GRPC_PORT"),
      routers: routerPorts,
    },
    metricsPortBase: read("METRICS_PORT_BASE")[0],
  };
  const fixed = [
    ports.port,
    ports.adminPort,
    ports.upstreamPort,
    ports.devnetPort,
    ports.grpcPorts.auth,
    ports.grpcPorts.metering,
    ports.grpcPorts.payment,
    ...routerPorts,
  ];
  const twice = fixed.filter((p, i) => Number.isInteger(p) && fixed.indexOf(p) !== i);
  if (twice.length > 0) problems.push(`a port is given twice: ${[...new Set(twice)].join(", ")}`);
  if (problems.length > 0) throw new Error(problems.join("\n"));
  return ports;
}

/**
 * One problem for each port of `ports` that something already listens on (an earlier `make up`
 * still running, say), naming the variable that moves it. The stack's readiness checks only
 * connect to each port, so without this a stack started over a running one would report itself
 * up while each of its processes failed to listen. METRICS_PORT_BASE counts one port per process:
 * api-edge, auth-policy, mpp-payment, metering and the routers.
 */
export async function portsInUse(ports: UpPorts, host = "127.0.0.1"): Promise<string[]> {
  const named: [string, number][] = [
    ["PORT", ports.port],
    ["ADMIN_PORT", ports.adminPort],
    ["FAKE_UPSTREAM_PORT", ports.upstreamPort],
    ["TEMPO_DEVNET_PORT", ports.devnetPort],
    ["AUTH_POLICY_GRPC_PORT", ports.grpcPorts.auth],
    ["MPP_PAYMENT_GRPC_PORT", ports.grpcPorts.payment],
    ["METERING_GRPC_PORT", ports.grpcPorts.metering],
    ...ports.grpcPorts.routers.map((p): [string, number] => ["INFERENCE_ROUTER_GRPC_PORTS", p]),
  ];
  const base = ports.metricsPortBase;
  if (base !== undefined)
    for (let i = 0; i < ports.grpcPorts.routers.length + 4; i++) named.push(["METRICS_PORT_BASE", base + i]);
  const problems: string[] = [];
  for (const [name, port] of named) {
    const code = await listenError(host, port);
    if (code === undefined) continue;
    const why = code === "EADDRINUSE" ? "is already in use" : `cannot be opened (${code})`;
    problems.push(
      `${name}: ${host}:${port} ${why}; stop what listens there (\`make down\` stops an earlier \`make up\`) or set ${name} to free ports`,
    );
  }
  return problems;
}

/** The error code of listening on host:port, or undefined when it could (and was closed again). */
function listenError(host: string, port: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", (err: NodeJS.ErrnoException) => resolve(err.code ?? "error"));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(undefined)));
  });
}
