import { createServer, type Server } from "node:net";
import { describe, expect, it } from "vitest";
import { portsInUse, upPorts } from "./up-ports.js";

/** A server on a free loopback port, and that port. */
async function listening(): Promise<{ server: Server; port: number }> {
  const server = createServer();
  await new Promise<void>((r) => server.listen({ host: "127.0.0.1", port: 0 }, r));
  return { server, port: (server.address() as { port: number }).port };
}

describe("make up's ports", () => {
  it("are the chart's and the demo's by default", () => {
    expect(upPorts({})).toEqual({
      port: 8080,
      adminPort: 8081,
      upstreamPort: 18000,
      devnetPort: 18545,
      grpcPorts: { auth: 50051, metering: 50054, payment: 50052, routers: [50053, 50063] },
      metricsPortBase: undefined,
    });
  });

  it("each move with its variable, so that a second stack can share the machine", () => {
    const ports = upPorts({
      PORT: "19080",
      ADMIN_PORT: "19081",
      FAKE_UPSTREAM_PORT: "19000",
      TEMPO_DEVNET_PORT: "19545",
      AUTH_POLICY_GRPC_PORT: "19051",
      MPP_PAYMENT_GRPC_PORT: "19052",
      METERING_GRPC_PORT: "19054",
      INFERENCE_ROUTER_GRPC_PORTS: "19053, 19063",
      METRICS_PORT_BASE: "19100",
    });
    expect(ports).toEqual({
      port: 19080,
      adminPort: 19081,
      upstreamPort: 19000,
      devnetPort: 19545,
      grpcPorts: { auth: 19051, metering: 19054, payment: 19052, routers: [19053, 19063] },
      metricsPortBase: 19100,
    });
  });

  it("refuses bad values, naming each variable at once", () => {
    const problems = () =>
      upPorts({
        FAKE_UPSTREAM_PORT: "abc",
        INFERENCE_ROUTER_GRPC_PORTS: "19053",
        AUTH_POLICY_GRPC_PORT: "8080",
      });
    expect(problems).toThrow(/FAKE_UPSTREAM_PORT=abc: expected a port/);
    expect(problems).toThrow(/INFERENCE_ROUTER_GRPC_PORTS: expected 2 comma-separated ports/);
    expect(problems).toThrow(/a port is given twice: 8080$/);
  });

  it("names each port something already listens on, and the variable that moves it", async () => {
    const edge = await listening();
    const metrics = await listening();
    // Free ports: listen, note the port, close.
    const free = await Promise.all([1, 2, 3, 4, 5, 6, 7, 8].map(() => listening()));
    await Promise.all(free.map(({ server }) => new Promise((r) => server.close(r))));
    const [admin, upstream, devnet, auth, payment, metering, r1, r2] = free.map((f) => f.port) as number[];
    try {
      const ports = {
        port: edge.port,
        adminPort: admin!,
        upstreamPort: upstream!,
        devnetPort: devnet!,
        grpcPorts: { auth: auth!, metering: metering!, payment: payment!, routers: [r1!, r2!] },
        metricsPortBase: metrics.port - 5,
      };
      expect(await portsInUse(ports)).toEqual([
        `PORT: 127.0.0.1:${edge.port} is already in use; stop what listens there (\`make down\` stops an earlier \`make up\`) or set PORT to free ports`,
        `METRICS_PORT_BASE: 127.0.0.1:${metrics.port} is already in use; stop what listens there (\`make down\` stops an earlier \`make up\`) or set METRICS_PORT_BASE to free ports`,
      ]);
      expect(
        await portsInUse({ ...ports, port: admin!, adminPort: edge.port, metricsPortBase: undefined }),
      ).toEqual([
        `ADMIN_PORT: 127.0.0.1:${edge.port} is already in use; stop what listens there (\`make down\` stops an earlier \`make up\`) or set ADMIN_PORT to free ports`,
      ]);
    } finally {
      await Promise.all([edge, metrics].map(({ server }) => new Promise((r) => server.close(r))));
    }
  });
});
