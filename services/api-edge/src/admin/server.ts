import type { InternalAuth } from "@tollgate/kit/credentials";
import { type Client, createClient, type MethodsOf } from "@tollgate/kit/grpc";
import { acceptRequestId } from "@tollgate/kit/ids";
import type { Logger } from "@tollgate/kit/log";
import type { AuthService } from "@tollgate/proto/auth";
import { MeteringService } from "@tollgate/proto/metering";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, LogController } from "fastify";
import { closeConnectionsWhileDraining } from "../http/drain.js";
import { acceptJsonOnly } from "../http/json-body.js";
import { clientErrorHandler, DEFAULT_LIMITS } from "../http/limits.js";
import { logResponses } from "../http/response-log.js";
import { openApiRoute } from "../openapi/serve.js";
import type { LeaseBook, PrincipalIds } from "../routes/leases.js";
import { AdminError, adminErrorBody, toAdminHttpError } from "./errors.js";
import {
  accountJson,
  connectionJson,
  createAccountRequest,
  createConnectionRequest,
  createKeyRequest,
  keyJson,
  listKeysFilter,
  rotateKeyRequest,
  updateAccountRequest,
  updateConnectionRequest,
  updateKeyRequest,
  usageJson,
  usageRequest,
} from "./mapping.js";
import { ADMIN_OPERATIONS, adminDocument } from "./openapi.js";
import { adminTokenCheck } from "./token.js";

/** Where the admin server listens and what it needs besides the edge's auth client. */
export interface AdminServerOptions {
  host: string;
  port: number;
  /** The shared admin token; the server never starts without one. Never logged. */
  token: string;
  /** metering's gRPC address, for usage reports. */
  meteringAddr: string;
}

/** The auth-policy RPCs the admin API calls. */
export type AdminAuthClient = Pick<
  Client<MethodsOf<typeof AuthService>>,
  | "createAccount"
  | "createConnection"
  | "createKey"
  | "listKeys"
  | "revokeKey"
  | "rotateKey"
  | "listAccounts"
  | "getAccount"
  | "updateAccount"
  | "deleteAccount"
  | "getConnection"
  | "updateConnection"
  | "deleteConnection"
  | "getKey"
  | "updateKey"
>;
/**
 * The replica's leases: their idle ones go back before a budget is shown, and those of keys a
 * change names stop at once.
 */
export type AdminLeases = Pick<LeaseBook, "returnIdleOf" | "stopLeasing">;
/** The metering RPC the admin API calls. */
export type AdminMeteringClient = Pick<Client<MethodsOf<typeof MeteringService>>, "getUsage">;

/** A running admin server. */
export interface AdminServer {
  port: number;
  stop(): Promise<void>;
}

/** Deadline of one admin call to auth-policy or metering. */
const CALL_TIMEOUT_MS = 10_000;
const call = { timeoutMs: CALL_TIMEOUT_MS };

type AccountParams = { Params: { accountId: string } };
type ConnectionParams = { Params: { accountId: string; connectionId: string } };
type KeyParams = { Params: { keyId: string } };

/**
 * Builds the admin HTTP API (not listening): account, connection and key lifecycle over
 * auth-policy's admin RPCs, and usage reports over metering. Every request, unknown paths
 * included, must carry the admin token first; bodies are read only after that.
 */
export function buildAdminApp(deps: {
  token: string;
  auth: AdminAuthClient;
  metering: AdminMeteringClient;
  /** This replica's leases (docs/money.md, "Leases"); absent: none to return. */
  leases?: AdminLeases;
  log: Logger;
}): FastifyInstance {
  const { auth, metering } = deps;
  const checkToken = adminTokenCheck(deps.token);
  const app = Fastify({
    loggerInstance: deps.log as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: "requestId" }),
    genReqId: (req) => acceptRequestId(req.headers["x-request-id"] as string | undefined),
    bodyLimit: 64 * 1024,
    return503OnClosing: true,
    // What Node's parser refuses (an obs-fold, Content-Length beside Transfer-Encoding, headers
    // too large) gets the error body and request id of every other answer, not fastify's own.
    clientErrorHandler: clientErrorHandler(deps.log as FastifyBaseLogger),
  });

  acceptJsonOnly(app, DEFAULT_LIMITS.maxJsonDepth, (code, message) => new AdminError(code, message));

  app.addHook("onRequest", async (req, reply) => {
    reply.header("x-request-id", req.id);
    // Answers carry secrets (new keys) and account data: no cache may keep them.
    reply.header("cache-control", "no-store");
    try {
      checkToken(req.headers.authorization);
    } catch (err) {
      reply.header("www-authenticate", 'Bearer realm="tollgate-admin"');
      throw err;
    }
  });
  logResponses(app, "admin request served");
  app.setErrorHandler((err, req, reply) => {
    const e = toAdminHttpError(err, req.log);
    return reply.code(e.status).send(adminErrorBody(e, req.id));
  });
  app.setNotFoundHandler((req, reply) => {
    const e = toAdminHttpError(
      new AdminError("not_found", `no admin route ${req.method} ${req.url.split("?")[0]}`),
      req.log,
    );
    return reply.code(e.status).send(adminErrorBody(e, req.id));
  });

  // A budget's spent, held and remaining (the single account, connection and key answers) are
  // read from auth-policy: this replica's idle leases of that account or key go back first, so
  // that held is what requests hold, not an allowance nobody uses. Usage reports are metering's
  // records, which no lease changes.
  const leases = deps.leases;
  if (leases) {
    app.addHook("preHandler", async (req) => {
      if (req.method !== "GET") return;
      const { accountId, keyId } = (req.params ?? {}) as { accountId?: string; keyId?: string };
      if (keyId !== undefined) await leases.returnIdleOf({ keyId });
      else if (accountId !== undefined) await leases.returnIdleOf({ accountId });
    });
  }

  // A change to keys (revoked, rotated, updated, or deleted with their connection or account)
  // holds on this replica from its next request: its leases of them stop at once, so it asks
  // auth-policy, which has the change, instead of serving the rest of a lease's second.
  const changed = (of: PrincipalIds) => deps.leases?.stopLeasing(of);

  app.post("/admin/v1/accounts", async (req, reply) => {
    const res = await auth.createAccount(createAccountRequest(req.body), call);
    req.log.info({ action: "account.create", accountId: res.account?.accountId }, "admin action");
    return reply.code(201).send(accountJson(res.account));
  });

  app.post<AccountParams>("/admin/v1/accounts/:accountId/connections", async (req, reply) => {
    const res = await auth.createConnection(createConnectionRequest(req.params.accountId, req.body), call);
    req.log.info(
      {
        action: "connection.create",
        accountId: res.connection?.accountId,
        connectionId: res.connection?.connectionId,
      },
      "admin action",
    );
    return reply.code(201).send(connectionJson(res.connection));
  });

  app.post<ConnectionParams>(
    "/admin/v1/accounts/:accountId/connections/:connectionId/keys",
    async (req, reply) => {
      const { accountId, connectionId } = req.params;
      const res = await auth.createKey(createKeyRequest(accountId, connectionId, req.body), call);
      req.log.info({ action: "key.create", accountId, keyId: res.key?.keyId }, "admin action");
      // The only time the secret leaves the gateway; it is never logged.
      return reply.code(201).send({ key: keyJson(res.key), secret: res.secret });
    },
  );

  app.get<AccountParams>("/admin/v1/accounts/:accountId/keys", async (req) => {
    const res = await auth.listKeys(
      { accountId: req.params.accountId, connectionId: listKeysFilter(req.query) },
      call,
    );
    return { object: "list", data: res.keys.map(keyJson) };
  });

  app.post<KeyParams>("/admin/v1/keys/:keyId/revoke", async (req) => {
    const res = await auth.revokeKey({ keyId: req.params.keyId }, call);
    changed({ keyId: req.params.keyId });
    req.log.info({ action: "key.revoke", keyId: req.params.keyId }, "admin action");
    return { key: keyJson(res.key) };
  });

  app.post<KeyParams>("/admin/v1/keys/:keyId/rotate", async (req, reply) => {
    const res = await auth.rotateKey(rotateKeyRequest(req.params.keyId, req.body), call);
    changed({ keyId: req.params.keyId });
    req.log.info(
      { action: "key.rotate", keyId: req.params.keyId, newKeyId: res.newKey?.keyId },
      "admin action",
    );
    return reply
      .code(201)
      .send({ old_key: keyJson(res.oldKey), new_key: keyJson(res.newKey), secret: res.secret });
  });

  app.get("/admin/v1/accounts", async () => {
    const res = await auth.listAccounts({}, call);
    return { object: "list", data: res.accounts.map(accountJson) };
  });

  app.get<AccountParams>("/admin/v1/accounts/:accountId", async (req) => {
    const res = await auth.getAccount({ accountId: req.params.accountId }, call);
    return { ...accountJson(res.account), connections: res.connections.map(connectionJson) };
  });

  app.patch<AccountParams>("/admin/v1/accounts/:accountId", async (req) => {
    const res = await auth.updateAccount(updateAccountRequest(req.params.accountId, req.body), call);
    changed({ accountId: req.params.accountId });
    req.log.info({ action: "account.update", accountId: req.params.accountId }, "admin action");
    return accountJson(res.account);
  });

  app.delete<AccountParams>("/admin/v1/accounts/:accountId", async (req) => {
    const { accountId } = req.params;
    const res = await auth.deleteAccount({ accountId }, call);
    changed({ accountId });
    req.log.info(
      { action: "account.delete", accountId, revokedKeys: res.revokedKeys.length },
      "admin action",
    );
    return { id: accountId, object: "account", deleted: true, revoked_keys: res.revokedKeys.map(keyJson) };
  });

  app.get<AccountParams>("/admin/v1/accounts/:accountId/connections", async (req) => {
    const res = await auth.getAccount({ accountId: req.params.accountId }, call);
    return { object: "list", data: res.connections.map(connectionJson) };
  });

  app.get<ConnectionParams>("/admin/v1/accounts/:accountId/connections/:connectionId", async (req) => {
    const res = await auth.getConnection(req.params, call);
    return connectionJson(res.connection);
  });

  app.patch<ConnectionParams>("/admin/v1/accounts/:accountId/connections/:connectionId", async (req) => {
    const { accountId, connectionId } = req.params;
    const res = await auth.updateConnection(updateConnectionRequest(accountId, connectionId, req.body), call);
    changed({ accountId, connectionId });
    req.log.info({ action: "connection.update", accountId, connectionId }, "admin action");
    return connectionJson(res.connection);
  });

  app.delete<ConnectionParams>("/admin/v1/accounts/:accountId/connections/:connectionId", async (req) => {
    const { accountId, connectionId } = req.params;
    const res = await auth.deleteConnection({ accountId, connectionId }, call);
    changed({ accountId, connectionId });
    req.log.info(
      { action: "connection.delete", accountId, connectionId, revokedKeys: res.revokedKeys.length },
      "admin action",
    );
    return {
      id: connectionId,
      object: "connection",
      account_id: accountId,
      deleted: true,
      revoked_keys: res.revokedKeys.map(keyJson),
    };
  });

  app.get<KeyParams>("/admin/v1/keys/:keyId", async (req) => {
    const res = await auth.getKey({ keyId: req.params.keyId }, call);
    return keyJson(res.key);
  });

  app.patch<KeyParams>("/admin/v1/keys/:keyId", async (req) => {
    const res = await auth.updateKey(updateKeyRequest(req.params.keyId, req.body), call);
    changed({ keyId: req.params.keyId });
    req.log.info({ action: "key.update", keyId: req.params.keyId }, "admin action");
    return keyJson(res.key);
  });

  // Behind the token like every admin route: the document is built once, with the app.
  app.get(ADMIN_OPERATIONS.getOpenApi.path, openApiRoute(adminDocument()).handler);

  app.get("/admin/v1/usage", async (req) => {
    const ask = usageRequest(req.query);
    const res = await metering.getUsage(ask, call);
    return usageJson(res, ask.granularity ?? 0, ask.byModel === true);
  });

  return app;
}

/**
 * Starts the admin API on its own port (8081 by default, docs/architecture.md), apart from the
 * public door, so that no public listener ever routes an admin path.
 */
export async function startAdminServer(
  opts: AdminServerOptions & {
    auth: AdminAuthClient;
    leases?: AdminLeases;
    log: Logger;
    internalAuth?: InternalAuth;
  },
): Promise<AdminServer> {
  const metering = createClient(MeteringService, opts.meteringAddr, opts.internalAuth);
  const log = opts.log.child({ server: "admin" });
  const app = buildAdminApp({
    token: opts.token,
    auth: opts.auth,
    metering,
    ...(opts.leases ? { leases: opts.leases } : {}),
    log,
  });
  const drain = closeConnectionsWhileDraining(app);
  try {
    await app.listen({ host: opts.host, port: opts.port });
  } catch (err) {
    metering.$close();
    throw err;
  }
  const address = app.server.address();
  const port = typeof address === "object" && address ? address.port : opts.port;
  log.info({ host: opts.host, port }, "admin api listening");
  return {
    port,
    stop: async () => {
      drain.start();
      await app.close();
      metering.$close();
    },
  };
}
