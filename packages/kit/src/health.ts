import { BinaryReader, BinaryWriter } from "@bufbuild/protobuf/wire";
import * as grpcJs from "@grpc/grpc-js";
import { service as healthService } from "grpc-health-check";
import type { GrpcHttp2Server, ServerCall } from "./grpc-server.js";

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

/** grpc.health.v1's ServingStatus values. */
const SERVING_STATUS = { UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 } as const;
type ServingStatus = keyof typeof SERVING_STATUS;

/** grpc.health.v1's HealthCheckRequest: `string service = 1`. */
function serviceOf(request: Uint8Array): string {
  const reader = new BinaryReader(request);
  let service = "";
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === 1 && wireType === 2) service = reader.string();
    else reader.skip(wireType);
  }
  return service;
}

/** grpc.health.v1's HealthCheckResponse: `ServingStatus status = 1`. */
function statusMessage(status: ServingStatus): Uint8Array {
  const writer = new BinaryWriter();
  if (SERVING_STATUS[status] !== 0) writer.tag(1, 0).int32(SERVING_STATUS[status]);
  return writer.finish();
}

const CHECK_PATH = "/grpc.health.v1.Health/Check";
const WATCH_PATH = "/grpc.health.v1.Health/Watch";

/** Tracks readiness of one service and publishes it over grpc.health.v1 and HTTP. */
export class Health {
  #serving = false;
  /** Each served name's status; undefined until served over gRPC. */
  #statuses: Map<string, ServingStatus> | undefined;
  #watchers = new Set<(name: string) => void>();
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
  addToGrpcServer(server: GrpcHttp2Server, serviceNames: readonly string[]): void {
    // "liveness" answers SERVING while the process can answer at all: a Redis or NATS outage
    // makes the service not ready, never a restart loop (Kubernetes probes ask for it by name).
    this.#statuses = new Map([
      ["", "NOT_SERVING"],
      [LIVENESS_SERVICE, "SERVING"],
    ]);
    this.#services = ["", ...serviceNames];
    this.alsoServeOn(server);
    this.#timer = setInterval(() => void this.#publish(), 2_000);
    this.#timer.unref();
  }

  /** Serves the same grpc.health.v1 on another server too (a plaintext probe port). */
  alsoServeOn(server: GrpcHttp2Server): void {
    server.register(CHECK_PATH, (call) => this.#check(call));
    server.register(WATCH_PATH, (call) => this.#watch(call));
  }

  #check(call: ServerCall): void {
    const status = this.#statuses?.get(serviceOf(call.request));
    if (status === undefined) call.end({ code: grpcJs.status.NOT_FOUND, details: "unknown service" });
    else call.answer(statusMessage(status));
  }

  /** Sends the named service's status now and again whenever it changes, until cancelled. */
  #watch(call: ServerCall): void {
    const name = serviceOf(call.request);
    let last: ServingStatus | undefined;
    const send = (changed: string) => {
      if (changed !== name) return;
      const status = this.#statuses?.get(name) ?? "SERVICE_UNKNOWN";
      if (status === last) return;
      last = status;
      call.write(statusMessage(status));
    };
    this.#watchers.add(send);
    call.onCancel(() => this.#watchers.delete(send));
    send(name);
  }

  async #publish(): Promise<void> {
    const statuses = this.#statuses;
    if (!statuses) return;
    const { ready } = await this.report();
    for (const name of this.#services) {
      const status = ready ? "SERVING" : "NOT_SERVING";
      if (statuses.get(name) === status) continue;
      statuses.set(name, status);
      for (const watcher of this.#watchers) watcher(name);
    }
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
