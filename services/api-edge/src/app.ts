import type { InternalAuth } from "@tollgate/kit/credentials";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { acceptRequestId } from "@tollgate/kit/ids";
import type { Logger } from "@tollgate/kit/log";
import { createMetrics, type MetricsServer, type Registry, serveMetrics } from "@tollgate/kit/metrics";
import { connectRedis, quitRedis } from "@tollgate/kit/redis";
import { type StopDeadline, stopInOrder } from "@tollgate/kit/shutdown";
import { AuthService } from "@tollgate/proto/auth";
import { InferenceService } from "@tollgate/proto/inference";
import { MeteringService } from "@tollgate/proto/metering";
import { PaymentService } from "@tollgate/proto/payment";
import { ROUTES, type RouteId } from "@tollgate/proto/routes";
import Fastify, {
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  LogController,
} from "fastify";
import { createMemoryIdempotencyStore } from "./adapters/memory-idempotency-store.js";
import { createMemoryResponseItemStore } from "./adapters/memory-response-item-store.js";
import { createRedisIdempotencyStore } from "./adapters/redis-idempotency-store.js";
import { createRedisResponseItemStore } from "./adapters/redis-response-item-store.js";
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
  refuseUnroutable,
  requireHost,
  serverOptions,
} from "./http/limits.js";

export type { EdgeLimits } from "./http/limits.js";

import type { IdempotencyStore } from "./domain/idempotency.js";
import { RESPONSE_ITEMS_TTL_MS, type ResponseItemStore } from "./domain/response-items.js";
import type { Drain } from "./http/drain.js";
import { logResponses } from "./http/response-log.js";
import { traceRequests } from "./http/tracing.js";
import { countRequests, edgeMetrics, timeInference } from "./metrics.js";
import type { PaidOffer } from "./openapi/payment-info.js";
import { publicOpenApiRoute } from "./openapi/serve.js";
import { chatCompletionsRoute } from "./routes/chat-completions.js";
import { completionsRoute } from "./routes/completions.js";
import type {
  AccountRouteContext,
  AuthClient,
  InferenceClient,
  MeteringClient,
  PaymentClient,
} from "./routes/context.js";
import { embeddingsRoute } from "./routes/embeddings.js";
import { LeaseBook, type LeaseClient } from "./routes/leases.js";
import { messagesRoute, sendAnthropicError } from "./routes/messages.js";
import { modelRoute, modelsRoute } from "./routes/models.js";
import { mppChatCompletionsRoute } from "./routes/mpp-chat-completions.js";
import { PaidCommits } from "./routes/paid-commit.js";
import { type AccountRoutes, type RouteImpl, registerRoutes } from "./routes/register.js";
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
  /** Redis for idempotency records and Responses output items shared by every replica; memory when unset. */
  redisUrl?: string;
  redisPrefix?: string;
  /** How long a Responses answer's output message is kept for `item_reference`; default 24 h. */
  responseItemsTtlMs?: number;
  /** Port of the Prometheus /metrics endpoint (0 picks a free one); absent: no endpoint. */
  metricsPort?: number;
  /** Default 127.0.0.1. */
  metricsHost?: string;
  /** Admit account-door requests on leases (docs/money.md, "Leases"); default true. */
  leases?: boolean;
  /** The paid door's plans and prices (the gateway configuration's), shown by GET /openapi.json. */
  offer?: PaidOffer;
}

/** Dependencies the caller already owns. */
export interface ApiEdgeDeps {
  /** The registry to fill (the all-in-one serves one per service, merged); default: a new one. */
  metrics?: Registry;
  /**
   * Clients of the services behind the edge the caller already has (the all-in-one calls them
   * in process); each one given replaces the gRPC client its address would dial.
   */
  clients?: {
    auth?: Client<MethodsOf<typeof AuthService>>;
    inference?: Client<MethodsOf<typeof InferenceService>>;
    payment?: Client<MethodsOf<typeof PaymentService>>;
    metering?: Client<MethodsOf<typeof MeteringService>>;
  };
}

/** A running api-edge. */
export interface ApiEdge {
  port: number;
  app: FastifyInstance;
  /** The admin API's port, when it runs. */
  adminPort?: number;
  /** The bound /metrics port, when metricsPort was given. */
  metricsPort?: number;
  stop(deadline?: StopDeadline): Promise<void>;
}

/** The one way a refusal is sent on the public port: the mapped status and the OpenAI-style body. */
function sendError(err: unknown, req: FastifyRequest, reply: FastifyReply) {
  const e = toHttpError(err, req.log);
  if (e.headers) reply.headers(e.headers);
  return reply.code(e.status).send(errorBody(e, req.id));
}

/**
 * What the public port's app is built from: the clients of the services behind it, the
 * idempotency and Responses item stores, the logger and the metrics registry. start() passes the gRPC clients and
 * the Redis or memory store; a test passes in-memory fakes and calls `app.inject()`.
 */
export interface ApiEdgePorts {
  auth: AuthClient;
  inference: InferenceClient;
  /** Absent: the paid door is off and its route does not exist. */
  payment?: PaymentClient;
  /** Where a stream's usage is recorded when its router is lost mid-stream. */
  metering?: MeteringClient;
  idempotencyStore: IdempotencyStore;
  /** Responses output items for later `item_reference` inputs; absent: memory, kept 24 h. */
  responseItemStore?: ResponseItemStore;
  /** auth-policy's lease calls; absent: every request is authorized on its own. */
  leases?: LeaseClient;
  log: Logger;
  metrics: Registry;
  /** Whether the services behind the edge answer (readiness); absent: always. */
  ready?: () => Promise<boolean>;
  /** The paid door's plans and prices, shown by GET /openapi.json; absent: none shown. */
  offer?: PaidOffer;
}

/** The public port's app, not yet listening, and its draining switch. */
export interface EdgeApp {
  app: FastifyInstance;
  drain: Drain;
  /** The replica's leases, returned when it stops; absent without lease calls. */
  leases?: LeaseBook;
  /** The paid route's Commits sent after their answers, which the stop waits for. */
  paidCommits: PaidCommits;
}

/** Every account-door route's implementation, by its id in the route table. */
function accountRoutes(ctx: AccountRouteContext): AccountRoutes {
  return {
    models: modelsRoute(ctx),
    model: modelRoute(ctx),
    chat: chatCompletionsRoute(ctx),
    completions: completionsRoute(ctx),
    responses: responsesRoute(ctx),
    messages: messagesRoute(ctx),
    think: thinkRoute(ctx),
    embeddings: embeddingsRoute(ctx),
  };
}

/** Builds the public port's app (hooks, error mapping, the routes of the route table) from its ports. */
export function buildApp(ports: ApiEdgePorts, limitsIn: Partial<EdgeLimits> = {}): EdgeApp {
  const { log } = ports;
  const limits: EdgeLimits = { ...DEFAULT_LIMITS, ...limitsIn };
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
  acceptJsonOnly(app, limits.maxJsonDepth, (code, message) => new EdgeError(code, message), {
    refuseIn: "route",
  });
  // Before the routes: their contexts take the onError hooks registered so far.
  drainOversizedBodies(app, limits);

  const drain = closeConnectionsWhileDraining(app);
  app.addHook("onRequest", async (req, reply) => {
    reply.header("x-request-id", req.id);
  });
  requireHost(app);
  refuseUnroutable(app.server);
  const metrics = edgeMetrics(ports.metrics);
  countRequests(app, metrics);
  logResponses(app, "request served");
  app.setErrorHandler(sendError);
  app.setNotFoundHandler((req, reply) => {
    const err = new EdgeError("not_found", `no route ${req.method} ${req.url.split("?")[0]}`);
    if (req.url.startsWith(`${ROUTES.messages.path}/`)) return sendAnthropicError(err, req, reply);
    const e = toHttpError(err, req.log);
    return reply.code(e.status).send(errorBody(e, req.id));
  });

  const idempotency = new Idempotency(ports.idempotencyStore);
  idempotency.register(app);
  const leases = ports.leases ? new LeaseBook(ports.leases, log) : undefined;
  const paidCommits = new PaidCommits();
  const ctx: AccountRouteContext = {
    auth: ports.auth,
    ...(leases ? { leases } : {}),
    inference: timeInference(ports.inference, metrics),
    ...(ports.metering ? { metering: ports.metering } : {}),
    idempotency,
    responseItems: ports.responseItemStore ?? createMemoryResponseItemStore(RESPONSE_ITEMS_TTL_MS),
    schemas: requestSchemas(limits.maxMessages),
    log,
  };
  const ready = ports.ready ?? (async () => true);
  const routes: Partial<Record<RouteId, RouteImpl>> = {
    livez: { handler: async () => ({ status: "ok" }) },
    readyz: {
      handler: async (_req, reply) => {
        const up = (await ready().catch(() => false)) && !drain.draining;
        return reply.code(up ? 200 : 503).send({ status: up ? "ready" : "not ready" });
      },
    },
    ...accountRoutes(ctx),
    ...(ports.payment
      ? { mppChat: mppChatCompletionsRoute({ ...ctx, payment: ports.payment, paidCommits }) }
      : {}),
  };
  routes.openapi = publicOpenApiRoute(routes, limits.maxMessages, ports.offer);
  registerRoutes(app, routes);
  return { app, drain, paidCommits, ...(leases ? { leases } : {}) };
}

/** Builds the HTTP server with its routes and the gRPC clients behind it, and starts listening. */
export async function start(opts: ApiEdgeOptions, log: Logger, deps: ApiEdgeDeps = {}): Promise<ApiEdge> {
  const who = opts.internalAuth;
  const given = deps.clients ?? {};
  const auth = given.auth ?? createClient(AuthService, opts.authPolicyAddr, who);
  const inference = given.inference ?? createClient(InferenceService, opts.inferenceRouterAddr, who);
  const payment =
    given.payment ??
    (opts.mppPaymentAddr ? createClient(PaymentService, opts.mppPaymentAddr, who) : undefined);
  const metering =
    given.metering ?? (opts.meteringAddr ? createClient(MeteringService, opts.meteringAddr, who) : undefined);
  const redis = opts.redisUrl ? connectRedis(opts.redisUrl, "api-edge", log) : undefined;
  const itemsTtlMs = opts.responseItemsTtlMs ?? RESPONSE_ITEMS_TTL_MS;
  const registry = deps.metrics ?? createMetrics("api-edge");
  const { app, drain, leases, paidCommits } = buildApp(
    {
      auth,
      ...(opts.leases !== false ? { leases: auth } : {}),
      inference,
      ...(payment ? { payment } : {}),
      ...(metering ? { metering } : {}),
      idempotencyStore: redis
        ? createRedisIdempotencyStore(redis, opts.redisPrefix ?? "tollgate:")
        : createMemoryIdempotencyStore(),
      responseItemStore: redis
        ? createRedisResponseItemStore(redis, opts.redisPrefix ?? "tollgate:", itemsTtlMs)
        : createMemoryResponseItemStore(itemsTtlMs),
      log,
      metrics: registry,
      ...(opts.offer ? { offer: opts.offer } : {}),
      ready: () =>
        Promise.all([auth.$ready(500), inference.$ready(500), redis?.ping()]).then(
          () => true,
          () => false,
        ),
    },
    opts.limits,
  );

  await app.listen({ host: opts.host, port: opts.port });
  const address = app.server.address();
  const port = typeof address === "object" && address ? address.port : opts.port;
  log.info({ port }, "api-edge listening");
  let admin: AdminServer | undefined;
  if (opts.admin) {
    try {
      admin = await startAdminServer({
        ...opts.admin,
        auth,
        ...(leases ? { leases } : {}),
        log,
        ...(who ? { internalAuth: who } : {}),
      });
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
    stop: (deadline?: StopDeadline) =>
      stopInOrder([
        () => drain.start(),
        // Stops accepting, lets in-flight requests and streams finish.
        () => app.close(),
        // Then no request runs on a lease any more: each goes back.
        () => leases?.close(),
        () => admin?.stop(),
        () => auth.$close(),
        () => inference.$close(),
        // Commits sent after their answer (routes/paid-commit.ts) finish before their client closes,
        // or are left to metering's once the stop's deadline comes.
        () => paidCommits.settled(deadline),
        () => payment?.$close(),
        () => metering?.$close(),
        () => redis && quitRedis(redis),
        () => metricsServer?.stop(),
      ]),
  };
}
