// The ports `make up` (deploy/local/up.ts) listens on: the chart's (packages/config/src/topology.ts)
// and the demo's by default, each movable by a variable (docs/configuration.md, "`make up`"), so
// that a second stack, or anything else already on a default port, can share the machine.
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
