import type { GatewayConfig } from "@tollgate/config";
import { implement, serveGrpc } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";
import { AuthService } from "@tollgate/proto/auth";
import { createConfigKeyStore } from "./adapters/config-key-store.js";
import { authHandlers } from "./transport/grpc/handlers.js";

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface AuthPolicyOptions {
  grpcHost: string;
  grpcPort: number;
  gateway: GatewayConfig;
}

/** A running auth-policy. */
export interface AuthPolicy {
  /** The bound gRPC port. */
  port: number;
  stop(): Promise<void>;
}

/** Builds the adapters, serves AuthService and grpc.health.v1, and returns a handle to stop it. */
export async function start(opts: AuthPolicyOptions, log: Logger): Promise<AuthPolicy> {
  const store = createConfigKeyStore(opts.gateway);
  const grpc = await serveGrpc({
    host: opts.grpcHost,
    port: opts.grpcPort,
    log,
    services: [implement(AuthService, authHandlers(store))],
  });
  log.info({ port: grpc.port }, "auth-policy serving");
  return { port: grpc.port, stop: () => grpc.stop() };
}
