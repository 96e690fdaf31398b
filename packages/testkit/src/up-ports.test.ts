import { describe, expect, it } from "vitest";
import { upPorts } from "./up-ports.js";

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
});
