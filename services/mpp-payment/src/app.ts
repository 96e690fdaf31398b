import { bindServer, createServer, shutdownServer } from "@tollgate/kit/grpc";
import { Health } from "@tollgate/kit/health";
import type { Logger } from "@tollgate/kit/log";
import { stopInOrder } from "@tollgate/kit/shutdown";
import { PaymentService } from "@tollgate/proto/payment";

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
  const health = new Health();
  const server = createServer();
  health.addToGrpcServer(server, [PaymentService.typeName]);
  const port = await bindServer(server, opts.grpcHost, opts.grpcPort);
  health.setServing(true);
  log.info({ port }, "mpp-payment serving (health only; paid door not implemented yet)");
  return {
    port,
    stop: () =>
      stopInOrder([() => health.setServing(false), () => shutdownServer(server), () => health.stop()]),
  };
}
