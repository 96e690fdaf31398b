import { createServer, type Server } from "node:net";
import { MeteringService } from "@tollgate/proto/metering";
import { describe, expect, it } from "vitest";
import type { InProcessService } from "./in-process.js";
import { createLogger } from "./log.js";
import { createMetrics } from "./metrics.js";
import { serveService } from "./service.js";

/** A service with no handlers: these tests only bind and stop its servers. */
const served = {
  service: MeteringService,
  handlers: {},
  access: {},
  log: createLogger({ service: "metering", level: "silent" }),
} as unknown as InProcessService<typeof MeteringService.method>;

const listen = (port: number) =>
  new Promise<Server>((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(port, "127.0.0.1", () => resolve(s));
  });
const close = (s: Server) => new Promise<void>((r) => s.close(() => r()));
const portOf = (s: Server) => (s.address() as { port: number }).port;

describe("serveService", () => {
  it("serves gRPC and, when asked, /metrics; stops both", async () => {
    const servers = await serveService({ grpcHost: "127.0.0.1", grpcPort: 0, metricsPort: 0 }, served, {
      checks: [],
      registry: createMetrics("metering"),
    });
    expect(servers.grpc.port).toBeGreaterThan(0);
    const res = await fetch(`http://127.0.0.1:${servers.metrics!.port}/metrics`);
    expect(res.status).toBe(200);
    await res.text();
    await servers.grpc.stop(0);
    await servers.metrics!.stop();
  });

  it("serves no /metrics without a port", async () => {
    const servers = await serveService({ grpcHost: "127.0.0.1", grpcPort: 0 }, served, {
      checks: [],
      registry: createMetrics("metering"),
    });
    expect(servers.metrics).toBeUndefined();
    await servers.grpc.stop(0);
  });

  it("gives the gRPC port back when the metrics port is taken, and throws", async () => {
    const taken = await listen(0);
    const free = await listen(0);
    const grpcPort = portOf(free);
    await close(free);
    await expect(
      serveService(
        { grpcHost: "127.0.0.1", grpcPort, metricsHost: "127.0.0.1", metricsPort: portOf(taken) },
        served,
        {
          checks: [],
          registry: createMetrics("metering"),
        },
      ),
    ).rejects.toThrow(/EADDRINUSE/);
    // Nothing is left listening on the gRPC port.
    await close(await listen(grpcPort));
    await close(taken);
  });
});
