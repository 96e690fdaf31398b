import * as grpc from "@grpc/grpc-js";
import { service as healthService } from "grpc-health-check";
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { serveGrpc } from "./grpc.js";
import { checkGrpcHealth, LIVENESS_SERVICE } from "./health.js";

describe("grpc.health.v1 readiness and liveness", () => {
  const stops: Array<() => Promise<void>> = [];
  afterAll(async () => {
    for (const stop of stops) await stop();
  });

  /** A server with no service and one readiness check, failing while `down()` says so. */
  async function serve(down: () => boolean) {
    const server = await serveGrpc({
      host: "127.0.0.1",
      port: 0,
      log: pino({ level: "silent" }),
      services: [],
      checks: [
        {
          name: "redis",
          check: async () => {
            if (down()) throw new Error("down");
          },
        },
      ],
    });
    stops.push(() => server.stop(100));
    return server;
  }

  it("reports readiness from the checks, and liveness as SERVING even while a dependency fails", async () => {
    let failing = false;
    const server = await serve(() => failing);
    const address = `127.0.0.1:${server.port}`;
    expect(await checkGrpcHealth(address)).toBe("SERVING");

    failing = true;
    await server.health.report();
    server.health.setServing(true);
    // setServing republishes the status from a fresh report.
    await new Promise((r) => setTimeout(r, 50));
    expect(await checkGrpcHealth(address)).toBe("NOT_SERVING");
    expect(await checkGrpcHealth(address, LIVENESS_SERVICE)).toBe("SERVING");
  });

  it("streams a watched service's status as it changes, and SERVICE_UNKNOWN for a name it does not serve", async () => {
    let down = false;
    const server = await serve(() => down);
    const Client = grpc.makeGenericClientConstructor(
      healthService as unknown as grpc.ServiceDefinition,
      "Health",
    );
    const client = new Client(
      `127.0.0.1:${server.port}`,
      grpc.credentials.createInsecure(),
    ) as unknown as grpc.Client & {
      watch(req: { service: string }): grpc.ClientReadableStream<{ status: string }>;
    };
    const seen: string[] = [];
    const unknown: string[] = [];
    const watch = client.watch({ service: "" });
    watch.on("data", (m: { status: string }) => seen.push(m.status));
    watch.on("error", () => {});
    const other = client.watch({ service: "no.such.Service" });
    other.on("data", (m: { status: string }) => unknown.push(m.status));
    other.on("error", () => {});
    await new Promise((r) => setTimeout(r, 100));
    down = true;
    server.health.setServing(true);
    await new Promise((r) => setTimeout(r, 200));
    watch.cancel();
    other.cancel();
    client.close();
    expect(seen).toEqual(["SERVING", "NOT_SERVING"]);
    expect(unknown).toEqual(["SERVICE_UNKNOWN"]);
  });
});
