// Key lifecycle behind the admin API: accounts, connections, keys (shown once, stored hashed),
// listing, revocation broadcast to every replica, rotation with a grace window.

import { routeNames } from "@tollgate/config";
import {
  type Budget,
  budgetChecks,
  MAX_BUDGET_AMOUNT,
  MAX_PERIOD_DAYS,
  periodAt,
  periodChanged,
  periodName,
  remainingOf,
} from "./budget.js";
import { AuthError } from "./errors.js";
import { generateKeyId, generateSecret, hashKey, lineageOf } from "./keys.js";
import type {
  AccountRecord,
  ConnectionLimits,
  ConnectionPolicy,
  KeyRecord,
  KeyStore,
  Ledger,
  RateLimits,
  RevocationPublisher,
  RouteName,
} from "./ports.js";

/** The shape of every id (the configuration file's rule). */
const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const MAX_PER_MINUTE = 4_294_967_295;
const MAX_NAME_LENGTH = 128;
/** Longest grace window a rotation may ask for. */
export const MAX_GRACE_SECONDS = 30 * 24 * 3_600;
/** Grace window of a rotation that names none. */
export const DEFAULT_GRACE_SECONDS = 24 * 3_600;
/** Output caps of a connection that names none (the configuration file's defaults). */
const DEFAULT_CAP = 1_024;
const DEFAULT_MAX_CAP = 4_096;
const ROUTES: readonly RouteName[] = routeNames;

/** What the admin operations need. */
export interface AdminDeps {
  store: KeyStore;
  publisher: RevocationPublisher;
  /** Public model ids of the gateway configuration; a connection may only name these. */
  knownModels: ReadonlySet<string>;
  /** Grace window of a rotation that names none. */
  defaultGraceSeconds?: number;
  /** Where budget spend is counted; without it, budgets are shown without their spend. */
  ledger?: Pick<Ledger, "admit">;
}

/** A budget's current period: settled spend, holds of requests still running, what is left. */
export interface BudgetUsage {
  spent: bigint;
  held: bigint;
  remaining: bigint;
  periodStart: Date;
  periodEnd: Date;
}

export interface CreateConnectionInput {
  accountId: string;
  connectionId: string;
  models: readonly string[];
  /** Empty: the first of models. */
  defaultModel: string;
  defaultMaxOutputTokens?: number;
  maxOutputTokens?: number;
  /** Empty: every route. */
  routes: readonly RouteName[];
  limits: ConnectionLimits;
  /** Spend cap of the connection; undefined: none. */
  budget?: Budget;
}

export interface CreateKeyInput {
  accountId: string;
  connectionId: string;
  expiresAt?: Date;
  name: string;
  /** Spend cap of the key alone; undefined: none. */
  budget?: Budget;
}

export interface RotateKeyInput {
  keyId: string;
  /** Default: the service's default grace (24 h). */
  graceSeconds?: number;
  /** Expiry of the new key. */
  expiresAt?: Date;
}

/** A key just issued: its record and its secret, which is never available again. */
export interface IssuedKey {
  key: KeyRecord;
  secret: string;
}

const invalid = (message: string) => new AuthError("invalid_argument", message);

function checkId(what: string, value: string): void {
  if (!ID.test(value)) throw invalid(`${what} must be 1-128 letters, digits and . _ : - (got '${value}')`);
}

function checkLimits(what: string, limits: RateLimits): void {
  for (const [field, value] of Object.entries(limits)) {
    if (value === undefined) continue;
    if (!Number.isInteger(value) || value < 1 || value > MAX_PER_MINUTE) {
      throw invalid(`${what}.${field} must be a whole number from 1 (leave it unset for unlimited)`);
    }
  }
}

function checkBudget(what: string, budget: Budget | undefined): void {
  if (!budget) return;
  if (budget.amount < 0n || budget.amount > MAX_BUDGET_AMOUNT) {
    throw invalid(`${what}.amount must be from 0 to ${MAX_BUDGET_AMOUNT} base units`);
  }
  const p = budget.period;
  if (typeof p === "object" && (!Number.isInteger(p.days) || p.days < 1 || p.days > MAX_PERIOD_DAYS)) {
    throw invalid(`${what}.period_days must be from 1 to ${MAX_PERIOD_DAYS}`);
  }
}

/**
 * Refuses to change a budget's period in place. Spend is counted per period (one counter per
 * period tag), so a budget given another period would count the new period from zero and forget
 * what was spent in it so far: a connection with 234 spent today under 300 a day could spend 300
 * more this month under 300 a month. The amount may change; a period changes by clearing the
 * budget and setting the new one, a deliberate fresh start (docs/money.md, "Budget periods").
 */
function checkPeriodKept(what: string, current: Budget | undefined, next: Budget | undefined): void {
  if (!current || !next || !periodChanged(current, next)) return;
  throw new AuthError(
    "budget_period_change",
    `the ${what}'s budget counts per '${periodName(current.period)}' period; giving it a '${periodName(next.period)}' ` +
      "period would count the new period from zero and forget what was spent in it so far. Keep the " +
      "period and change the amount, or clear the budget and set the new one, which counts only " +
      "spend from then on",
  );
}

function checkExpiry(expiresAt: Date | undefined, now: Date): void {
  if (expiresAt && expiresAt.getTime() <= now.getTime()) throw invalid("expires_at must be in the future");
}

/** Builds a key record for a fresh secret. */
function issue(
  secret: string,
  fields: Pick<KeyRecord, "accountId" | "connectionId" | "name"> & Partial<KeyRecord>,
  now: Date,
): KeyRecord {
  return {
    keyId: generateKeyId(),
    hash: hashKey(secret),
    createdAt: now,
    last4: secret.slice(-4),
    ...fields,
  };
}

/** The admin operations over one store and one revocation broadcaster. */
export function createAdmin(deps: AdminDeps) {
  const { store } = deps;
  const defaultGrace = deps.defaultGraceSeconds ?? DEFAULT_GRACE_SECONDS;

  async function requireConnection(accountId: string, connectionId: string): Promise<ConnectionPolicy> {
    const connection = await store.connection(accountId, connectionId);
    if (connection) return connection;
    if (!(await store.account(accountId))) {
      throw new AuthError("account_not_found", `no account '${accountId}'`);
    }
    throw new AuthError("connection_not_found", `no connection '${connectionId}' in account '${accountId}'`);
  }

  async function broadcast(key: KeyRecord, revokedAt: Date, reason: "revoked" | "rotated"): Promise<void> {
    try {
      await deps.publisher.publish({
        keyHash: key.hash.toString("hex"),
        keyId: key.keyId,
        revokedAt,
        reason,
      });
    } catch {
      // The key is already refused by every auth-policy replica; only caches may lag. A retry
      // of the same call broadcasts again.
      throw new AuthError(
        "broadcast_failed",
        "the key no longer works, but the change could not be broadcast to caches; retry the call",
      );
    }
  }

  async function requireAccount(accountId: string): Promise<AccountRecord> {
    const account = await store.account(accountId);
    if (!account) throw new AuthError("account_not_found", `no account '${accountId}'`);
    return account;
  }

  /** Revokes every key of `keys` that is not revoked yet and broadcasts each, as revokeKey does. */
  async function revokeAll(keys: readonly KeyRecord[], now: Date): Promise<KeyRecord[]> {
    const revoked: KeyRecord[] = [];
    for (const k of keys) {
      const key = await store.revokeKey(k.keyId, now);
      if (!key) continue;
      await broadcast(key, key.revokedAt ?? now, "revoked");
      revoked.push(key);
    }
    return revoked;
  }

  /** Reads (never holds) a budget's spend in its current period. */
  async function usageOf(
    accountId: string,
    owner: { connectionId: string; keyLineageId: string },
    budgets: { connectionBudget?: Budget; keyBudget?: Budget },
    now: Date,
  ): Promise<BudgetUsage | undefined> {
    const budget = budgets.connectionBudget ?? budgets.keyBudget;
    if (!budget || !deps.ledger) return undefined;
    const checks = budgetChecks({ accountId, ...owner, ...budgets, now });
    const check = checks[0];
    const count = (await deps.ledger.admit([], { peek: checks }, now)).budgets[0];
    if (!check || !count) return undefined;
    const period = periodAt(budget.period, now);
    return {
      spent: count.spent,
      held: count.held,
      remaining: remainingOf(check, count, 0n),
      periodStart: new Date(period.startMs),
      periodEnd: new Date(period.endMs),
    };
  }

  return {
    /** A connection's budget spend in its current period; undefined without a budget. */
    connectionUsage: (c: ConnectionPolicy, now = new Date()) =>
      usageOf(
        c.accountId,
        { connectionId: c.connectionId, keyLineageId: "" },
        c.budget ? { connectionBudget: c.budget } : {},
        now,
      ),

    /**
     * A key's own budget spend in its current period, counted with every key of its rotation
     * lineage; undefined without a budget.
     */
    keyUsage: (k: KeyRecord, now = new Date()) =>
      usageOf(
        k.accountId,
        { connectionId: k.connectionId, keyLineageId: lineageOf(k) },
        k.budget ? { keyBudget: k.budget } : {},
        now,
      ),

    /** Every account, ordered by id. */
    listAccounts: () => store.listAccounts(),

    /** One account and its connections. */
    async getAccount(accountId: string) {
      const account = await requireAccount(accountId);
      return { account, connections: await store.listConnections(accountId) };
    },

    /** Replaces an account's limits. */
    async updateAccount(input: { accountId: string; limits: RateLimits }) {
      const account = await requireAccount(input.accountId);
      checkLimits("limits", input.limits);
      const next: AccountRecord = { ...account, limits: input.limits };
      await store.putAccount(next);
      return next;
    },

    /**
     * Revokes every key of an account (each broadcast), then removes its connections and the
     * account. A broadcast failure stops it with the state so far; a retry finishes it.
     */
    async deleteAccount(accountId: string, now = new Date()): Promise<KeyRecord[]> {
      await requireAccount(accountId);
      const revoked = await revokeAll(await store.listKeys(accountId), now);
      for (const c of await store.listConnections(accountId))
        await store.deleteConnection(accountId, c.connectionId);
      await store.deleteAccount(accountId);
      return revoked;
    },

    /** One connection. */
    getConnection: (accountId: string, connectionId: string) => requireConnection(accountId, connectionId),

    /**
     * Sets or clears a connection's budget and, when given, replaces its limits. A budget's
     * period is never changed in place (checkPeriodKept).
     */
    async updateConnection(input: {
      accountId: string;
      connectionId: string;
      budget?: Budget;
      clearBudget: boolean;
      limits?: ConnectionLimits;
    }) {
      if (input.budget && input.clearBudget) throw invalid("give a budget or clear_budget, not both");
      checkBudget("budget", input.budget);
      if (input.limits) {
        checkLimits("limits.connection", input.limits.connection);
        checkLimits("limits.per_key", input.limits.perKey);
        for (const [route, limits] of Object.entries(input.limits.routes)) {
          if (!ROUTES.includes(route as RouteName)) throw invalid(`unknown route '${route}' in limits`);
          checkLimits(`limits.routes.${route}`, limits ?? {});
        }
      }
      const current = await requireConnection(input.accountId, input.connectionId);
      checkPeriodKept("connection", current.budget, input.budget);
      const { budget: _old, ...rest } = current;
      const budget = input.clearBudget ? undefined : (input.budget ?? current.budget);
      const next: ConnectionPolicy = {
        ...rest,
        ...(input.limits ? { limits: input.limits } : {}),
        ...(budget ? { budget } : {}),
      };
      await store.putConnection(next);
      return next;
    },

    /** Revokes every key of a connection (each broadcast), then removes the connection. */
    async deleteConnection(accountId: string, connectionId: string, now = new Date()): Promise<KeyRecord[]> {
      await requireConnection(accountId, connectionId);
      const revoked = await revokeAll(await store.listKeys(accountId, connectionId), now);
      await store.deleteConnection(accountId, connectionId);
      return revoked;
    },

    /** One key, never its secret. */
    async getKey(keyId: string): Promise<KeyRecord> {
      const key = await store.findById(keyId);
      if (!key) throw new AuthError("key_not_found", `no key '${keyId}'`);
      return key;
    },

    /** Sets or clears a key's own budget; its period is never changed in place (checkPeriodKept). */
    async updateKey(input: { keyId: string; budget?: Budget; clearBudget: boolean }): Promise<KeyRecord> {
      if (input.budget && input.clearBudget) throw invalid("give a budget or clear_budget, not both");
      checkBudget("budget", input.budget);
      const current = await store.findById(input.keyId);
      if (!current) throw new AuthError("key_not_found", `no key '${input.keyId}'`);
      if (!input.budget && !input.clearBudget) return current;
      checkPeriodKept("key", current.budget, input.budget);
      const key = await store.setKeyBudget(input.keyId, input.clearBudget ? undefined : input.budget);
      if (!key) throw new AuthError("key_not_found", `no key '${input.keyId}'`);
      return key;
    },

    /** Adds an account with optional account-wide limits. */
    async createAccount(input: { accountId: string; limits: RateLimits }, now = new Date()) {
      checkId("account_id", input.accountId);
      checkLimits("limits", input.limits);
      const account: AccountRecord = { accountId: input.accountId, limits: input.limits, createdAt: now };
      if (!(await store.createAccount(account))) {
        throw new AuthError("account_exists", `the account '${input.accountId}' exists already`);
      }
      return account;
    },

    /** Adds a connection: models, default model, output-cap policy, routes and limits. */
    async createConnection(input: CreateConnectionInput, now = new Date()) {
      checkId("account_id", input.accountId);
      checkId("connection_id", input.connectionId);
      if (input.models.length === 0) throw invalid("models must name at least one model");
      for (const m of input.models) {
        if (!deps.knownModels.has(m)) throw invalid(`unknown model '${m}'`);
      }
      if (new Set(input.models).size !== input.models.length) throw invalid("models lists a model twice");
      const defaultModel = input.defaultModel === "" ? input.models[0]! : input.defaultModel;
      if (!input.models.includes(defaultModel))
        throw invalid(`default_model '${defaultModel}' is not in models`);
      const maxCap = input.maxOutputTokens ?? DEFAULT_MAX_CAP;
      const defaultCap = input.defaultMaxOutputTokens ?? Math.min(DEFAULT_CAP, maxCap);
      if (!Number.isInteger(maxCap) || maxCap < 1) throw invalid("max_output_tokens must be at least 1");
      if (!Number.isInteger(defaultCap) || defaultCap < 1) {
        throw invalid("default_max_output_tokens must be at least 1");
      }
      if (defaultCap > maxCap) throw invalid("default_max_output_tokens is above max_output_tokens");
      for (const r of input.routes) if (!ROUTES.includes(r)) throw invalid(`unknown route '${r}'`);
      checkLimits("limits.connection", input.limits.connection);
      checkLimits("limits.per_key", input.limits.perKey);
      for (const [route, limits] of Object.entries(input.limits.routes)) {
        if (!ROUTES.includes(route as RouteName)) throw invalid(`unknown route '${route}' in limits`);
        checkLimits(`limits.routes.${route}`, limits ?? {});
      }
      checkBudget("budget", input.budget);
      if (!(await store.account(input.accountId))) {
        throw new AuthError("account_not_found", `no account '${input.accountId}'`);
      }
      const connection: ConnectionPolicy = {
        accountId: input.accountId,
        connectionId: input.connectionId,
        models: [...input.models],
        defaultModel,
        defaultMaxOutputTokens: defaultCap,
        maxOutputTokens: maxCap,
        ...(input.routes.length > 0 ? { routes: [...new Set(input.routes)] } : {}),
        limits: input.limits,
        ...(input.budget ? { budget: input.budget } : {}),
        createdAt: now,
      };
      if (!(await store.createConnection(connection))) {
        throw new AuthError(
          "connection_exists",
          `the connection '${input.connectionId}' exists already in account '${input.accountId}'`,
        );
      }
      return connection;
    },

    /** Issues a key for a connection. The secret is returned here and never again. */
    async createKey(input: CreateKeyInput, now = new Date()): Promise<IssuedKey> {
      if (input.name.length > MAX_NAME_LENGTH)
        throw invalid(`name is longer than ${MAX_NAME_LENGTH} characters`);
      checkExpiry(input.expiresAt, now);
      checkBudget("budget", input.budget);
      await requireConnection(input.accountId, input.connectionId);
      const secret = generateSecret();
      const key = issue(
        secret,
        {
          accountId: input.accountId,
          connectionId: input.connectionId,
          name: input.name,
          ...(input.expiresAt ? { expiresAt: input.expiresAt } : {}),
          ...(input.budget ? { budget: input.budget } : {}),
        },
        now,
      );
      // A collision of 238 random bits does not happen; refuse rather than overwrite if it did.
      if (!(await store.createKey(key))) throw new Error("key id or hash collision");
      return { key, secret };
    },

    /** The keys of an account or one of its connections, oldest first. */
    async listKeys(input: { accountId: string; connectionId: string }): Promise<KeyRecord[]> {
      if (input.connectionId !== "") await requireConnection(input.accountId, input.connectionId);
      else if (!(await store.account(input.accountId))) {
        throw new AuthError("account_not_found", `no account '${input.accountId}'`);
      }
      return store.listKeys(input.accountId, input.connectionId || undefined);
    },

    /**
     * Revokes a key on every replica at once and broadcasts it. Idempotent: a repeat keeps the
     * first revocation time and broadcasts again.
     */
    async revokeKey(keyId: string, now = new Date()): Promise<KeyRecord> {
      const key = await store.revokeKey(keyId, now);
      if (!key) throw new AuthError("key_not_found", `no key '${keyId}'`);
      await broadcast(key, key.revokedAt ?? now, "revoked");
      return key;
    },

    /**
     * Issues a replacement for a working key; the old key keeps working for the grace window,
     * then answers "rotated_api_key" and its end is broadcast (by the deadline sweeper).
     */
    async rotateKey(input: RotateKeyInput, now = new Date()): Promise<IssuedKey & { old: KeyRecord }> {
      const grace = input.graceSeconds ?? defaultGrace;
      if (!Number.isInteger(grace) || grace < 0 || grace > MAX_GRACE_SECONDS) {
        throw invalid(`grace_seconds must be from 0 to ${MAX_GRACE_SECONDS}`);
      }
      checkExpiry(input.expiresAt, now);
      const current = await store.findById(input.keyId);
      if (!current) throw new AuthError("key_not_found", `no key '${input.keyId}'`);
      const secret = generateSecret();
      const key = issue(
        secret,
        {
          accountId: current.accountId,
          connectionId: current.connectionId,
          name: current.name,
          rotatedFrom: current.keyId,
          // The replacement keeps the key's budget and spends from the same counter, its
          // lineage's: during the grace both keys together, and after it the new key, never
          // spend more than the budget's amount in a period (docs/money.md, "Budget periods").
          lineageId: lineageOf(current),
          ...(current.budget ? { budget: current.budget } : {}),
          ...(input.expiresAt ? { expiresAt: input.expiresAt } : {}),
        },
        now,
      );
      const graceEndsAt = new Date(now.getTime() + grace * 1_000);
      const outcome = await store.rotateKey(current.keyId, key, graceEndsAt, now);
      if (!outcome.ok) {
        if (outcome.reason === "not_found") throw new AuthError("key_not_found", `no key '${input.keyId}'`);
        if (outcome.reason === "conflict") throw new Error("key id or hash collision");
        throw new AuthError(
          "key_not_active",
          `the key '${input.keyId}' is ${outcome.reason} and cannot be rotated; create a new key instead`,
        );
      }
      return { key, secret, old: outcome.old };
    },
  };
}

/** The admin operations, as createAdmin builds them. */
export type Admin = ReturnType<typeof createAdmin>;
