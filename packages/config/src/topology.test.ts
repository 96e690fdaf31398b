import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { dialEnv, dialOptions, SERVICE_NAMES, TOPOLOGY, type TopologyDial } from "./topology.js";

interface ChartComponent {
  ports: { name: string; port: number; env: string }[];
  connects: Record<string, { component: string; headless?: boolean; ifDisabled?: string }>;
  nats: boolean;
  redis: boolean;
  configFile: boolean;
}

const values = parseYaml(
  readFileSync(new URL("../../../helm/tollgate/values.yaml", import.meta.url), "utf8"),
) as { components: Record<string, ChartComponent> };

describe("the chart's components agree with the topology", () => {
  it("has one component per service, and no other", () => {
    expect(Object.keys(TOPOLOGY).sort()).toEqual([...SERVICE_NAMES]);
    expect(Object.keys(values.components).sort()).toEqual([...SERVICE_NAMES]);
  });

  it.each(SERVICE_NAMES)(
    "%s: same ports, peers (with their variables), NATS, Redis and configuration file",
    (name) => {
      const chart = values.components[name]!;
      const topo = TOPOLOGY[name];
      expect(chart.ports.map(({ name, port, env }) => ({ name, port, env }))).toEqual(
        topo.ports.map(({ name, port, env }) => ({ name, port, env })),
      );
      const connects = Object.fromEntries(
        (topo.dials as readonly TopologyDial[]).map((d) => [
          d.env,
          {
            component: d.service,
            ...(d.headless ? { headless: true } : {}),
            ...(d.optional ? { ifDisabled: "off" } : {}),
          },
        ]),
      );
      expect(chart.connects).toEqual(connects);
      const uses = ({ nats, redis, configFile }: { nats: boolean; redis: boolean; configFile: boolean }) => ({
        nats,
        redis,
        configFile,
      });
      expect(uses(chart)).toEqual(uses(topo));
    },
  );
});

describe("dialEnv and dialOptions", () => {
  const addrs: Record<string, string[]> = {
    "auth-policy": ["10.0.0.1:50051"],
    "inference-router": ["10.0.0.3:1", "10.0.0.4:2"],
    metering: ["10.0.0.5:50054"],
    "mpp-payment": [],
  };

  it("gives api-edge one variable per peer, replicas comma-separated, an absent optional peer left out", () => {
    expect(dialEnv("api-edge", (p) => addrs[p] ?? [])).toEqual({
      AUTH_POLICY_ADDR: "10.0.0.1:50051",
      INFERENCE_ROUTER_ADDR: "10.0.0.3:1,10.0.0.4:2",
      METERING_ADDR: "10.0.0.5:50054",
    });
    expect(dialEnv("auth-policy", () => [])).toEqual({});
  });

  it("refuses to wire a service whose required peer has no address", () => {
    expect(() => dialEnv("metering", () => [])).toThrow(/metering needs auth-policy \(AUTH_POLICY_ADDR\)/);
    expect(() => dialOptions("api-edge", () => undefined)).toThrow(/api-edge needs auth-policy/);
  });

  it("names the start() options of each peer", () => {
    expect(dialOptions("metering", () => "127.0.0.1:1")).toEqual({
      authPolicyAddr: "127.0.0.1:1",
      mppPaymentAddr: "127.0.0.1:1",
    });
    // Without the paid door, metering runs without mpp-payment.
    expect(dialOptions("metering", (p) => (p === "mpp-payment" ? undefined : "127.0.0.1:1"))).toEqual({
      authPolicyAddr: "127.0.0.1:1",
    });
    expect(dialOptions("api-edge", (p) => (p === "mpp-payment" ? undefined : `${p}:1`))).toEqual({
      authPolicyAddr: "auth-policy:1",
      inferenceRouterAddr: "inference-router:1",
      meteringAddr: "metering:1",
    });
  });
});
