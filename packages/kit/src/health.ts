import type * as grpc from "@grpc/grpc-js";
import * as grpcJs from "@grpc/grpc-js";
import { HealthImplementation, service as healthService } from "grpc-health-check";

/** One dependency whose failure makes the process not ready (Redis PING, NATS connected, ...). */
export interface HealthCheck {
  name: string;
  /** Resolves when the dependency answers; rejects otherwise. */
  check(): Promise<void>;
}

/** grpc.health.v1 service name that reports liveness (always SERVING while the process runs). */
export const LIVENESS_SERVICE = "liveness";

/** A readiness report: ready only when started, not draining, and every check passes. */
export interface HealthReport {
  ready: boolean;
  checks: Record<string, "ok" | "failing">;
}

const CHECK_TIMEOUT_MS = 1_000;

function withTimeout(p: Promise<void>): Promise<void> {
  return Promise.race([
    p,
    new Promise<void>((_, reject) =>
      setTimeout(() => reject(new Error("timeout")), CHECK_TIMEOUT_MS).unref(),
    ),
  ]);
}

/** Tracks readiness of one service and publishes it over grpc.health.v1 and HTTP. */
export class Health {
  #serving = false;
  #grpc: HealthImplementation | undefined;
  #services: string[] = [];
  #timer: NodeJS.Timeout | undefined;

  constructor(private readonly checks: readonly HealthCheck[] = []) {}

  /** Runs every check and returns the report. */
  async report(): Promise<HealthReport> {
    const results = await Promise.all(
      this.checks.map(
        async (c) =>
          [
            c.name,
            await withTimeout(c.check()).then(
              () => "ok" as const,
              () => "failing" as const,
            ),
          ] as const,
      ),
    );
    const checks = Object.fromEntries(results);
    return { ready: this.#serving && results.every(([, r]) => r === "ok"), checks };
  }

  /** Marks the service as serving (after start) or not (when shutdown begins). */
  setServing(serving: boolean): void {
    this.#serving = serving;
    void this.#publish();
  }

  /** Serves grpc.health.v1 on `server` for "" and each named service, refreshed every 2 s. */
  addToGrpcServer(server: grpc.Server, serviceNames: readonly string[]): void {
    // "liveness" answers SERVING while the process can answer at all: a Redis or NATS outage
    // makes the service not ready, never a restart loop (Kubernetes probes ask for it by name).
    this.#grpc = new HealthImplementation({ "": "NOT_SERVING", [LIVENESS_SERVICE]: "SERVING" });
    this.#services = ["", ...serviceNames];
    this.#grpc.addToServer(server);
    this.#timer = setInterval(() => void this.#publish(), 2_000);
    this.#timer.unref();
  }

  /** Serves the same grpc.health.v1 on another server too (a plaintext probe port). */
  alsoServeOn(server: grpc.Server): void {
    this.#grpc?.addToServer(server);
  }

  async #publish(): Promise<void> {
    if (!this.#grpc) return;
    const { ready } = await this.report();
    for (const name of this.#services) this.#grpc.setStatus(name, ready ? "SERVING" : "NOT_SERVING");
  }

  /** Stops the refresh timer. */
  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
  }
}

/** Asks a gRPC server's grpc.health.v1 Check for `service` ("" = the whole server). */
export function checkGrpcHealth(address: string, service = "", timeoutMs = 2_000): Promise<string> {
  const Ctor = grpcJs.makeGenericClientConstructor(
    healthService as unknown as grpcJs.ServiceDefinition,
    "Health",
  );
  const client = new Ctor(address, grpcJs.credentials.createInsecure()) as unknown as grpcJs.Client & {
    check(
      req: { service: string },
      opts: grpcJs.CallOptions,
      cb: (err: grpcJs.ServiceError | null, res: { status: string }) => void,
    ): void;
  };
  return new Promise<string>((resolve, reject) => {
    client.check({ service }, { deadline: Date.now() + timeoutMs }, (err, res) => {
      client.close();
      if (err) reject(err);
      else resolve(res.status);
    });
  });
}
