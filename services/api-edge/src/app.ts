import type { InternalAuth } from "@tollgate/kit/credentials";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { acceptRequestId } from "@tollgate/kit/ids";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type MetricsServer, type Registry, serveMetrics } from "@tollgate/kit/metrics";
import { connectRedis, quitRedis } from "@tollgate/kit/redis";
import { stopInOrder } from "@tollgate/kit/shutdown";
import { AuthService } from "@tollgate/proto/auth";
import { InferenceService } from "@tollgate/proto/inference";
import { MeteringService } from "@tollgate/proto/metering";
import { PaymentService } from "@tollgate/proto/payment";
import Fastify, {
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  LogController,
} from "fastify";
import { createMemoryIdempotencyStore } from "./adapters/memory-idempotency-store.js";
import { createRedisIdempotencyStore } from "./adapters/redis-idempotency-store.js";
import { type AdminServer, type AdminServerOptions, startAdminServer } from "./admin/server.js";
import { EdgeError } from "./domain/errors.js";
import { closeConnectionsWhileDraining } from "./http/drain.js";
import { errorBody, toHttpError } from "./http/errors.js";
import { Idempotency } from "./http/idempotency.js";
import { acceptJsonOnly } from "./http/json-body.js";
import {
  DEFAULT_LIMITS,
  drainOversizedBodies,
  type EdgeLimits,
  requireHost,
  serverOptions,
} from "./http/limits.js";

export type { EdgeLimits } from "./http/limits.js";

import { logResponses } from "./http/response-log.js";
import { traceRequests } from "./http/tracing.js";
import { countRequests, edgeMetrics, timeInference } from "./metrics.js";
import { chatCompletionsRoute } from "./routes/chat-completions.js";
import { completionsRoute } from "./routes/completions.js";
import type { AccountRouteContext } from "./routes/context.js";
import { modelsRoute } from "./routes/models.js";
import { mppChatCompletionsRoute } from "./routes/mpp-chat-completions.js";
import { responsesRoute } from "./routes/responses.js";
import { thinkRoute } from "./routes/think.js";
import { requestSchemas } from "./schemas/requests.js";

declare module "fastify" {
  interface FastifyRequest {
    /** The exact body bytes, forwarded as received (and, on the paid door, digested). */
    rawBody?: Buffer;
  }
}

/** What start() needs; main.ts builds it from the environment, the all-in-one process directly. */
export interface ApiEdgeOptions {
  host: string;
  port: number;
  authPolicyAddr: string;
  inferenceRouterAddr: string;
  /**
   * This process's credential when it calls the internal services (loadConfig builds it and
   * refuses to run without one unless INTERNAL_AUTH=off). Absent: none, for tests.
   */
  internalAuth?: InternalAuth;
  /** Absent: the paid door is off and its route does not exist. */
  mppPaymentAddr?: string;
  /** metering, where a stream's usage is recorded when its router is lost mid-stream. */
  meteringAddr?: string;
  /** The public port's limits; each one absent takes its default (docs/account-door.md, "Limits"). */
  limits?: Partial<EdgeLimits>;
  /** Absent: the admin API does not start, and no port serves it. */
  admin?: AdminServerOptions;
  /** Redis for idempotency records shared by every replica; memory when unset. */
  redisUrl?: string;
  redisPrefix?: string;
  /** Port of the Prometheus /metrics endpoint (0 picks a free one); absent: no endpoint. */
  metricsPort?: number;
  /** Default 127.0.0.1. */
  metricsHost?: string;
}

/** Dependencies the caller already owns. */
export interface ApiEdgeDeps {
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
}

/** A running api-edge. */
export interface ApiEdge {
  port: number;
  app: FastifyInstance;
  /** The admin API's port, when it runs. */
  adminPort?: number;
  /** The bound /metrics port, when metricsPort was given. */
  metricsPort?: number;
  stop(): Promise<void>;
}

/** The one way a refusal is sent on the public port: the mapped status and the OpenAI-style body. */
function sendError(err: unknown, req: FastifyRequest, reply: FastifyReply) {
  const e = toHttpError(err, req.log);
  if (e.headers) reply.headers(e.headers);
  return reply.code(e.status).send(errorBody(e, req.id));
}

/** Builds the HTTP server with its routes and the gRPC clients behind it, and starts listening. */
export async function start(opts: ApiEdgeOptions, log: Logger, deps: ApiEdgeDeps = {}): Promise<ApiEdge> {
  const who = opts.internalAuth;
  const auth: Client<MethodsOf<typeof AuthService>> = createClient(AuthService, opts.authPolicyAddr, who);
  const inference: Client<MethodsOf<typeof InferenceService>> = createClient(
    InferenceService,
    opts.inferenceRouterAddr,
    who,
  );
  const payment = opts.mppPaymentAddr ? createClient(PaymentService, opts.mppPaymentAddr, who) : undefined;
  const metering = opts.meteringAddr ? createClient(MeteringService, opts.meteringAddr, who) : undefined;

  const limits: EdgeLimits = { ...DEFAULT_LIMITS, ...opts.limits };
  const app = Fastify({
    ...serverOptions(limits, log as FastifyBaseLogger),
    // A URL fastify cannot decode gets the same error body as every other refusal.
    frameworkErrors: sendError,
    loggerInstance: log as FastifyBaseLogger,
    // Fastify's own per-request lines are off; onResponse logs one fixed line per request.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: "requestId" }),
    genReqId: (req) => acceptRequestId(req.headers["x-request-id"] as string | undefined),
    return503OnClosing: true,
    keepAliveTimeout: 65_000,
  });

  if (limits.maxConnections > 0) app.server.maxConnections = limits.maxConnections;
  traceRequests(app);
  acceptJsonOnly(app, limits.maxJsonDepth, (code, message) => new EdgeError(code, message));
  // Before the routes: their contexts take the onError hooks registered so far.
  drainOversizedBodies(app, limits);

  const drain = closeConnectionsWhileDraining(app);
  app.addHook("onRequest", async (req, reply) => {
    reply.header("x-request-id", req.id);
  });
  requireHost(app);
  const registry = deps.metrics ?? createMetrics("api-edge");
  const metrics = edgeMetrics(registry);
  countRequests(app, metrics);
  logResponses(app, "request served");
  app.setErrorHandler(sendError);
  app.setNotFoundHandler((req, reply) => {
    const e = toHttpError(
      new EdgeError("not_found", `no route ${req.method} ${req.url.split("?")[0]}`),
      req.log,
    );
    return reply.code(e.status).send(errorBody(e, req.id));
  });

  app.get("/livez", async () => ({ status: "ok" }));
  app.get("/readyz", async (_req, reply) => {
    const ready = await Promise.all([auth.$ready(500), inference.$ready(500), redis?.ping()]).then(
      () => true,
      () => false,
    );
    return reply
      .code(ready && !drain.draining ? 200 : 503)
      .send({ status: ready && !drain.draining ? "ready" : "not ready" });
  });
  const redis = opts.redisUrl ? connectRedis(opts.redisUrl, "api-edge") : undefined;
  const idempotency = new Idempotency(
    redis
      ? createRedisIdempotencyStore(redis, opts.redisPrefix ?? "tollgate:")
      : createMemoryIdempotencyStore(),
  );
  idempotency.register(app);
  const ctx: AccountRouteContext = {
    auth,
    inference: timeInference(inference, metrics),
    ...(metering ? { metering } : {}),
    idempotency,
    schemas: requestSchemas(limits.maxMessages),
    log,
  };
  modelsRoute(app, ctx);
  chatCompletionsRoute(app, ctx);
  completionsRoute(app, ctx);
  responsesRoute(app, ctx);
  thinkRoute(app, ctx);
  if (payment) mppChatCompletionsRoute(app, { ...ctx, payment });

  await app.listen({ host: opts.host, port: opts.port });
  const address = app.server.address();
  const port = typeof address === "object" && address ? address.port : opts.port;
  log.info({ port }, "api-edge listening");
  let admin: AdminServer | undefined;
  if (opts.admin) {
    try {
      admin = await startAdminServer({ ...opts.admin, auth, log, ...(who ? { internalAuth: who } : {}) });
    } catch (err) {
      await app.close();
      throw err;
    }
  }
  let metricsServer: MetricsServer | undefined;
  if (opts.metricsPort !== undefined) {
    try {
      metricsServer = await serveMetrics(registry, opts.metricsHost ?? "127.0.0.1", opts.metricsPort);
    } catch (err) {
      await stopInOrder([() => app.close(), () => admin?.stop()]);
      throw err;
    }
  }

  return {
    port,
    app,
    ...(admin ? { adminPort: admin.port } : {}),
    ...(metricsServer ? { metricsPort: metricsServer.port } : {}),
    stop: () =>
      stopInOrder([
        () => drain.start(),
        // Stops accepting, lets in-flight requests and streams finish.
        () => app.close(),
        () => admin?.stop(),
        () => auth.$close(),
        () => inference.$close(),
        () => payment?.$close(),
        () => metering?.$close(),
        () => redis && quitRedis(redis),
        () => metricsServer?.stop(),
      ]),
  };
}
