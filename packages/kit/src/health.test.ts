import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { serveGrpc } from "./grpc.js";
import { checkGrpcHealth, LIVENESS_SERVICE } from "./health.js";

describe("grpc.health.v1 readiness and liveness", () => {
  let failing = false;
  const stops: Array<() => Promise<void>> = [];
  afterAll(async () => {
    for (const stop of stops) await stop();
  });

  it("reports readiness from the checks, and liveness as SERVING even while a dependency fails", async () => {
    const server = await serveGrpc({
      host: "127.0.0.1",
      port: 0,
      log: pino({ level: "silent" }),
      services: [],
      checks: [
        {
          name: "redis",
          check: async () => {
            if (failing) throw new Error("down");
          },
        },
      ],
    });
    stops.push(() => server.stop(100));
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
});
