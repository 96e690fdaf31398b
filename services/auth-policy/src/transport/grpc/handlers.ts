import type { MessageInitShape } from "@bufbuild/protobuf";
import { type Timestamp, timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { Prices } from "@tollgate/config";
import { type Handlers, STORE_UNAVAILABLE } from "@tollgate/kit/grpc";
import type { Logger } from "@tollgate/kit/log";
import { isRedisUnavailable } from "@tollgate/kit/redis";
import {
  type AccountSchema,
  type AuthorizeRequest,
  type AuthService,
  type Budget as BudgetMsg,
  BudgetPeriod as BudgetPeriodMsg,
  type BudgetSchema,
  type BudgetUsageSchema,
  type ConnectionLimits as ConnectionLimitsMsg,
  type ConnectionSchema,
  type KeyInfoSchema,
  KeyState,
  type RateLimits as RateLimitsMsg,
  Route,
  SettleOutcome,
} from "@tollgate/proto/auth";
import { OPERATIONS, operationOf } from "@tollgate/proto/routes";
import type { Admin, BudgetUsage } from "../../domain/admin.js";
import {
  type Authorization,
  type AuthorizeDeps,
  type AuthorizeInput,
  authorize,
} from "../../domain/authorize.js";
import {
  type Budget,
  MAX_SETTLE_BATCH,
  type Settlement,
  type SettleOutcome as SettleOutcomeName,
  settleReservation,
  settleReservations,
} from "../../domain/budget.js";
import { AuthError } from "../../domain/errors.js";
import { keyState } from "../../domain/keys.js";
import { acquireLease, LEASE_USE_MS, returnLease } from "../../domain/lease.js";
import type {
  AccountRecord,
  ConnectionLimits,
  ConnectionPolicy,
  KeyRecord,
  RateLimits,
  RouteName,
} from "../../domain/ports.js";
import { toStatusError } from "./errors.js";

const ROUTE_ENUM: Readonly<Record<RouteName, Route>> = OPERATIONS;

const KEY_STATE = {
  active: KeyState.ACTIVE,
  rotating: KeyState.ROTATING,
  rotated: KeyState.ROTATED,
  expired: KeyState.EXPIRED,
  revoked: KeyState.REVOKED,
} satisfies Record<ReturnType<typeof keyState>, KeyState>;

function routeName(route: Route): RouteName {
  const name = operationOf(route);
  if (!name) throw new AuthError("invalid_argument", `unknown route ${route}`);
  return name;
}

const SETTLE_OUTCOME = {
  settled: SettleOutcome.SETTLED,
  settled_after_expiry: SettleOutcome.SETTLED_AFTER_EXPIRY,
  already_settled: SettleOutcome.ALREADY_SETTLED,
  unknown: SettleOutcome.UNKNOWN_RESERVATION,
} satisfies Record<SettleOutcomeName, SettleOutcome>;

const dateOf = (t: Timestamp | undefined) => (t ? timestampDate(t) : undefined);

const BASE_UNITS = /^(0|[1-9][0-9]*)$/;
const INT64_MAX = 2n ** 63n - 1n;

/** A wire amount (decimal string of base units, int64); invalid_argument otherwise. */
function baseUnitsIn(what: string, value: string): bigint {
  const amount = BASE_UNITS.test(value) ? BigInt(value) : -1n;
  if (amount < 0n || amount > INT64_MAX) {
    throw new AuthError("invalid_argument", `${what} must be a decimal string of base units`);
  }
  return amount;
}

function budgetIn(m: BudgetMsg | undefined): Budget | undefined {
  if (!m) return undefined;
  const amount = baseUnitsIn("budget.amount", m.amount);
  switch (m.period) {
    case BudgetPeriodMsg.UNSPECIFIED:
    case BudgetPeriodMsg.MONTH:
      return { amount, period: "month" };
    case BudgetPeriodMsg.WEEK:
      return { amount, period: "week" };
    case BudgetPeriodMsg.DAY:
      return { amount, period: "day" };
    case BudgetPeriodMsg.DAYS:
      return { amount, period: { days: m.periodDays } };
    default:
      throw new AuthError("invalid_argument", `unknown budget period ${m.period}`);
  }
}

const PERIOD_OUT = {
  month: BudgetPeriodMsg.MONTH,
  week: BudgetPeriodMsg.WEEK,
  day: BudgetPeriodMsg.DAY,
} as const;

function budgetOut(b: Budget | undefined): { budget: MessageInitShape<typeof BudgetSchema> } | undefined {
  if (!b) return undefined;
  const p = b.period;
  return {
    budget: {
      amount: b.amount.toString(),
      period: typeof p === "object" ? BudgetPeriodMsg.DAYS : PERIOD_OUT[p],
      periodDays: typeof p === "object" ? p.days : 0,
    },
  };
}

function limitsIn(m: RateLimitsMsg | undefined): RateLimits {
  return {
    ...(m?.requestsPerMinute !== undefined ? { requestsPerMinute: m.requestsPerMinute } : {}),
    ...(m?.tokensPerMinute !== undefined ? { tokensPerMinute: m.tokensPerMinute } : {}),
  };
}

function connectionLimitsIn(m: ConnectionLimitsMsg | undefined): ConnectionLimits {
  const routes: ConnectionLimits["routes"] = {};
  for (const r of m?.routes ?? []) {
    const name = routeName(r.route);
    if (routes[name]) throw new AuthError("invalid_argument", `limits name the route '${name}' twice`);
    routes[name] = limitsIn(r.limits);
  }
  return { connection: limitsIn(m?.connection), perKey: limitsIn(m?.perKey), routes };
}

function accountOut(a: AccountRecord): MessageInitShape<typeof AccountSchema> {
  return { accountId: a.accountId, limits: a.limits, createdAt: timestampFromDate(a.createdAt) };
}

/** A budget's current period on the wire, amounts as decimal strings. */
function usageOut(
  u: BudgetUsage | undefined,
): { budgetUsage: MessageInitShape<typeof BudgetUsageSchema> } | undefined {
  if (!u) return undefined;
  return {
    budgetUsage: {
      spent: u.spent.toString(),
      held: u.held.toString(),
      remaining: u.remaining.toString(),
      periodStart: timestampFromDate(u.periodStart),
      periodEnd: timestampFromDate(u.periodEnd),
    },
  };
}

function connectionOut(c: ConnectionPolicy, usage?: BudgetUsage): MessageInitShape<typeof ConnectionSchema> {
  return {
    ...usageOut(usage),
    accountId: c.accountId,
    connectionId: c.connectionId,
    models: [...c.models],
    defaultModel: c.defaultModel,
    defaultMaxOutputTokens: c.defaultMaxOutputTokens,
    maxOutputTokens: c.maxOutputTokens,
    routes: (c.routes ?? []).map((r) => ROUTE_ENUM[r]),
    ...budgetOut(c.budget),
    limits: {
      connection: c.limits.connection,
      perKey: c.limits.perKey,
      routes: Object.entries(c.limits.routes).map(([route, limits]) => ({
        route: ROUTE_ENUM[route as RouteName],
        limits: limits ?? {},
      })),
    },
    createdAt: timestampFromDate(c.createdAt),
  };
}

/** A key as the admin API shows it: never the secret, never the hash. */
function keyOut(k: KeyRecord, now: Date, usage?: BudgetUsage): MessageInitShape<typeof KeyInfoSchema> {
  return {
    ...usageOut(usage),
    keyId: k.keyId,
    accountId: k.accountId,
    connectionId: k.connectionId,
    name: k.name,
    createdAt: timestampFromDate(k.createdAt),
    ...(k.expiresAt ? { expiresAt: timestampFromDate(k.expiresAt) } : {}),
    ...(k.revokedAt ? { revokedAt: timestampFromDate(k.revokedAt) } : {}),
    rotatedFrom: k.rotatedFrom ?? "",
    rotatedTo: k.rotatedTo ?? "",
    ...(k.graceEndsAt ? { graceEndsAt: timestampFromDate(k.graceEndsAt) } : {}),
    last4: k.last4,
    state: KEY_STATE[keyState(k, now)],
    ...budgetOut(k.budget),
  };
}

/** Runs a handler body, turning domain errors into gRPC statuses. */
async function mapped<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw toStatusError(err);
  }
}

/** An AuthorizeRequest as the domain's input. */
function authorizeIn(req: AuthorizeRequest): AuthorizeInput {
  const route = operationOf(req.route);
  return {
    key: req.key,
    model: req.model,
    ...(route ? { route } : {}),
    ...(req.maxOutputTokens !== undefined ? { maxOutputTokens: req.maxOutputTokens } : {}),
    ...(req.estimatedInputTokens !== undefined ? { estimatedInputTokens: req.estimatedInputTokens } : {}),
    ...(req.bodyBytes !== undefined ? { bodyBytes: req.bodyBytes } : {}),
    ...(req.messageCount !== undefined ? { messageCount: req.messageCount } : {}),
    ...(req.outputSequences ? { outputSequences: req.outputSequences } : {}),
    ...(req.checkOnly ? { checkOnly: true } : {}),
    ...(req.requireReasoning ? { requireReasoning: true } : {}),
  };
}

/** An authorization on the wire (AuthorizeResponse, without model prices). */
function authorizationOut(a: Authorization) {
  return {
    principal: { accountId: a.accountId, connectionId: a.connectionId, keyId: a.keyId },
    model: a.model,
    ...(a.maxOutputTokens !== undefined ? { maxOutputTokens: a.maxOutputTokens } : {}),
    allowedModels: [...a.allowedModels],
    defaultModel: a.defaultModel,
    ...(a.rateLimit ? { rateLimit: a.rateLimit } : {}),
    ...(a.keyValidUntil ? { keyValidUntil: timestampFromDate(a.keyValidUntil) } : {}),
    reservationId: a.reservationId ?? "",
    quote: a.quote?.toString() ?? "",
    budgetRemaining: a.budgetRemaining?.toString() ?? "",
    keyBudgetRemaining: a.keyBudgetRemaining?.toString() ?? "",
  };
}

/** One model's prices on the wire. */
function priceOut(model: string, p: Prices) {
  return {
    model,
    inputPerMillion: p.inputPerMillion.toString(),
    outputPerMillion: p.outputPerMillion.toString(),
  };
}

/** Maps AuthService messages to the domain and back. */
export function authHandlers(
  deps: AuthorizeDeps & { admin: Admin; log: Logger },
): Handlers<typeof AuthService> {
  const { admin, log, prices } = deps;
  return {
    authorize: (req) =>
      mapped(async () => {
        const a = await authorize(deps, authorizeIn(req));
        return {
          ...authorizationOut(a),
          ...(req.route === Route.MODELS
            ? {
                modelPrices: a.allowedModels.flatMap((model) => {
                  const p = prices.get(model);
                  return p ? [priceOut(model, p)] : [];
                }),
              }
            : {}),
        };
      }),

    acquireLease: (req) =>
      mapped(async () => {
        if (!req.request) throw new AuthError("invalid_argument", "request is missing");
        const { verdict, lease } = await acquireLease(deps, authorizeIn(req.request), req.requests);
        const p = prices.get(verdict.model);
        return {
          grant: authorizationOut(verdict),
          granted: lease !== undefined,
          leaseId: lease?.leaseId ?? "",
          budget: lease?.budget?.toString() ?? "",
          ...(lease?.requests !== undefined ? { requests: lease.requests } : {}),
          ...(lease?.tokens !== undefined ? { tokens: lease.tokens } : {}),
          useMs: LEASE_USE_MS,
          ...(p ? { prices: priceOut(verdict.model, p) } : {}),
        };
      }),

    returnLease: (req) =>
      mapped(async () => {
        const { released } = await returnLease(deps.ledger, req.leaseId, {
          committed: baseUnitsIn("committed", req.committed),
          unusedRequests: req.unusedRequests,
          unusedTokens: req.unusedTokens,
          unsure: req.unsure.map((u) => ({ ticket: u.ticket, quote: baseUnitsIn("quote", u.quote) })),
        });
        return { released: released.toString() };
      }),

    createAccount: (req) =>
      mapped(async () => {
        const account = await admin.createAccount({ accountId: req.accountId, limits: limitsIn(req.limits) });
        log.info({ accountId: account.accountId }, "account created");
        return { account: accountOut(account) };
      }),

    createConnection: (req) =>
      mapped(async () => {
        const connection = await admin.createConnection({
          accountId: req.accountId,
          connectionId: req.connectionId,
          models: req.models,
          defaultModel: req.defaultModel,
          ...(req.defaultMaxOutputTokens !== undefined
            ? { defaultMaxOutputTokens: req.defaultMaxOutputTokens }
            : {}),
          ...(req.maxOutputTokens !== undefined ? { maxOutputTokens: req.maxOutputTokens } : {}),
          routes: req.routes.map(routeName),
          limits: connectionLimitsIn(req.limits),
          ...(req.budget ? { budget: budgetIn(req.budget)! } : {}),
        });
        log.info(
          { accountId: connection.accountId, connectionId: connection.connectionId },
          "connection created",
        );
        return { connection: connectionOut(connection) };
      }),

    createKey: (req) =>
      mapped(async () => {
        const expiresAt = dateOf(req.expiresAt);
        const now = new Date();
        const { key, secret } = await admin.createKey(
          {
            accountId: req.accountId,
            connectionId: req.connectionId,
            name: req.name,
            ...(expiresAt ? { expiresAt } : {}),
            ...(req.budget ? { budget: budgetIn(req.budget)! } : {}),
          },
          now,
        );
        log.info(
          { accountId: key.accountId, connectionId: key.connectionId, keyId: key.keyId },
          "key created",
        );
        return { key: keyOut(key, now), secret };
      }),

    listKeys: (req) =>
      mapped(async () => {
        const now = new Date();
        const keys = await admin.listKeys({ accountId: req.accountId, connectionId: req.connectionId });
        return { keys: keys.map((k) => keyOut(k, now)) };
      }),

    revokeKey: (req) =>
      mapped(async () => {
        const now = new Date();
        const key = await admin.revokeKey(req.keyId, now);
        log.info({ accountId: key.accountId, keyId: key.keyId }, "key revoked");
        return { key: keyOut(key, now) };
      }),

    rotateKey: (req) =>
      mapped(async () => {
        const now = new Date();
        const expiresAt = dateOf(req.expiresAt);
        const { key, secret, old } = await admin.rotateKey(
          {
            keyId: req.keyId,
            ...(req.graceSeconds !== undefined ? { graceSeconds: req.graceSeconds } : {}),
            ...(expiresAt ? { expiresAt } : {}),
          },
          now,
        );
        log.info(
          {
            accountId: key.accountId,
            keyId: key.keyId,
            rotatedFrom: old.keyId,
            graceEndsAt: old.graceEndsAt,
          },
          "key rotated",
        );
        return { oldKey: keyOut(old, now), newKey: keyOut(key, now), secret };
      }),

    listAccounts: () => mapped(async () => ({ accounts: (await admin.listAccounts()).map(accountOut) })),

    getAccount: (req) =>
      mapped(async () => {
        const { account, connections } = await admin.getAccount(req.accountId);
        return { account: accountOut(account), connections: connections.map((c) => connectionOut(c)) };
      }),

    updateAccount: (req) =>
      mapped(async () => {
        const account = await admin.updateAccount({ accountId: req.accountId, limits: limitsIn(req.limits) });
        log.info({ accountId: account.accountId }, "account updated");
        return { account: accountOut(account) };
      }),

    deleteAccount: (req) =>
      mapped(async () => {
        const now = new Date();
        const revoked = await admin.deleteAccount(req.accountId, now);
        log.info({ accountId: req.accountId, revokedKeys: revoked.length }, "account deleted");
        return { revokedKeys: revoked.map((k) => keyOut(k, now)) };
      }),

    getConnection: (req) =>
      mapped(async () => {
        const connection = await admin.getConnection(req.accountId, req.connectionId);
        return { connection: connectionOut(connection, await admin.connectionUsage(connection)) };
      }),

    updateConnection: (req) =>
      mapped(async () => {
        const connection = await admin.updateConnection({
          accountId: req.accountId,
          connectionId: req.connectionId,
          ...(req.budget ? { budget: budgetIn(req.budget)! } : {}),
          clearBudget: req.clearBudget,
          ...(req.limits ? { limits: connectionLimitsIn(req.limits) } : {}),
        });
        log.info(
          { accountId: connection.accountId, connectionId: connection.connectionId },
          "connection updated",
        );
        return { connection: connectionOut(connection, await admin.connectionUsage(connection)) };
      }),

    deleteConnection: (req) =>
      mapped(async () => {
        const now = new Date();
        const revoked = await admin.deleteConnection(req.accountId, req.connectionId, now);
        log.info(
          { accountId: req.accountId, connectionId: req.connectionId, revokedKeys: revoked.length },
          "connection deleted",
        );
        return { revokedKeys: revoked.map((k) => keyOut(k, now)) };
      }),

    getKey: (req) =>
      mapped(async () => {
        const now = new Date();
        const key = await admin.getKey(req.keyId);
        return { key: keyOut(key, now, await admin.keyUsage(key, now)) };
      }),

    updateKey: (req) =>
      mapped(async () => {
        const key = await admin.updateKey({
          keyId: req.keyId,
          ...(req.budget ? { budget: budgetIn(req.budget)! } : {}),
          clearBudget: req.clearBudget,
        });
        log.info({ accountId: key.accountId, keyId: key.keyId }, "key updated");
        const now = new Date();
        return { key: keyOut(key, now, await admin.keyUsage(key, now)) };
      }),

    settleReservation: (req) =>
      mapped(async () => {
        const settlement = await settleReservation(deps.ledger, {
          reservationId: req.reservationId,
          cost: baseUnitsIn("actual_cost", req.actualCost),
          eventId: req.eventId,
        });
        const fields = {
          reservationId: req.reservationId,
          eventId: req.eventId,
          outcome: settlement.outcome,
        };
        if (settlement.outcome === "unknown") log.warn(fields, "unknown reservation not settled");
        else log.debug({ ...fields, cost: settlement.cost?.toString() }, "reservation settled");
        return {
          outcome: SETTLE_OUTCOME[settlement.outcome],
          settledCost: settlement.cost?.toString() ?? "",
        };
      }),

    settleReservations: (req) =>
      mapped(async () => {
        if (req.items.length > MAX_SETTLE_BATCH) {
          throw new AuthError("invalid_argument", `at most ${MAX_SETTLE_BATCH} reservations per call`);
        }
        // An item with a malformed cost fails alone, as its SettleReservation would.
        const costs = req.items.map((item) => {
          try {
            return baseUnitsIn("actual_cost", item.actualCost);
          } catch (err) {
            return err as AuthError;
          }
        });
        const valid = req.items.flatMap((item, k) => {
          const cost = costs[k];
          return typeof cost === "bigint"
            ? [{ reservationId: item.reservationId, cost, eventId: item.eventId }]
            : [];
        });
        const settled = await settleReservations(deps.ledger, valid);
        let next = 0;
        const results = req.items.map((item, k) => {
          const cost = costs[k];
          const r: Settlement | Error =
            typeof cost === "bigint" ? (settled[next++] ?? new Error("not settled")) : cost!;
          const fields = { reservationId: item.reservationId, eventId: item.eventId };
          if (r instanceof Error) {
            const errorCode =
              r instanceof AuthError ? r.code : isRedisUnavailable(r) ? STORE_UNAVAILABLE : "internal";
            if (errorCode === "internal") log.error({ ...fields, err: r }, "reservation not settled");
            else log.warn({ ...fields, errorCode }, "reservation not settled");
            return { outcome: SettleOutcome.UNSPECIFIED, settledCost: "", errorCode };
          }
          if (r.outcome === "unknown")
            log.warn({ ...fields, outcome: r.outcome }, "unknown reservation not settled");
          else log.debug({ ...fields, outcome: r.outcome, cost: r.cost?.toString() }, "reservation settled");
          return { outcome: SETTLE_OUTCOME[r.outcome], settledCost: r.cost?.toString() ?? "", errorCode: "" };
        });
        return { results };
      }),
  };
}
