import type { GatewayConfig } from "@tollgate/config";
import { addService, bindServer, createServer, shutdownServer } from "@tollgate/kit/grpc";
import { Health } from "@tollgate/kit/health";
import type { Logger } from "@tollgate/kit/log";
import { stopInOrder } from "@tollgate/kit/shutdown";
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
  const health = new Health();
  const server = createServer();
  addService(server, AuthService, authHandlers(store), log);
  health.addToGrpcServer(server, [AuthService.typeName]);
  const port = await bindServer(server, opts.grpcHost, opts.grpcPort);
  health.setServing(true);
  log.info({ port }, "auth-policy serving");
  return {
    port,
    stop: () =>
      stopInOrder([() => health.setServing(false), () => shutdownServer(server), () => health.stop()]),
  };
}
