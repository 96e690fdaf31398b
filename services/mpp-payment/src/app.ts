import { serveGrpc } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";

/** What start() needs. */
export interface MppPaymentOptions {
  grpcHost: string;
  grpcPort: number;
}

/** A running mpp-payment. */
export interface MppPayment {
  port: number;
  stop(): Promise<void>;
}

/**
 * Serves grpc.health.v1. The PaymentService contract (proto/tollgate/payment/v1) is fixed; its
 * implementation is the paid-door issue, so until then its RPCs are not registered and callers
 * get gRPC UNIMPLEMENTED rather than a stand-in answer.
 */
export async function start(opts: MppPaymentOptions, log: Logger): Promise<MppPayment> {
  const grpc = await serveGrpc({ host: opts.grpcHost, port: opts.grpcPort, log, services: [] });
  log.info({ port: grpc.port }, "mpp-payment serving (health only; paid door not implemented yet)");
  return { port: grpc.port, stop: () => grpc.stop() };
}
