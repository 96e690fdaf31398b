import type { BudgetConfig, ConnectionConfig, GatewayConfig, RateLimitsConfig } from "@tollgate/config";
import { type Budget, periodChanged, periodName } from "./budget.js";
import { hashKey } from "./keys.js";
import type {
  ConnectionLimits,
  ConnectionPolicy,
  KeyDeadline,
  KeyRecord,
  KeyStore,
  RateLimits,
} from "./ports.js";

const limitsOf = (l: RateLimitsConfig | undefined): RateLimits => ({
  ...(l?.requestsPerMinute !== undefined ? { requestsPerMinute: l.requestsPerMinute } : {}),
  ...(l?.tokensPerMinute !== undefined ? { tokensPerMinute: l.tokensPerMinute } : {}),
});

const budgetOf = (b: BudgetConfig | undefined): { budget: Budget } | Record<never, never> =>
  b ? { budget: { amount: b.amount, period: b.period } } : {};

/** The rate limits a configured connection declares. */
export function connectionLimitsOf(c: ConnectionConfig): ConnectionLimits {
  const l = c.limits;
  return {
    connection: limitsOf({ requestsPerMinute: l?.requestsPerMinute, tokensPerMinute: l?.tokensPerMinute }),
    perKey: limitsOf({ requestsPerMinute: l?.keyRequestsPerMinute, tokensPerMinute: l?.keyTokensPerMinute }),
    routes: Object.fromEntries(Object.entries(l?.routes ?? {}).map(([route, rl]) => [route, limitsOf(rl)])),
  };
}

/**
 * A budget whose period the file changed since the store last had it: from this start its spend
 * counts from zero in the new period, as after clearing a budget and setting another (the admin
 * API refuses such a change in place; docs/money.md, "Budget periods").
 */
export interface BudgetPeriodChange {
  scope: "connection" | "key";
  /** The connection's or key's id (never a secret). */
  id: string;
  from: string;
  to: string;
}

/**
 * Loads the configuration file's accounts, connections and (development) keys into the store;
 * safe to run on every start of every replica. The file owns what it declares: accounts and
 * connections are replaced (budgets too), a key's connection, name, expiry and budget follow the file. A revocation
 * or rotation done at run time is never undone. A configured key whose secret changed, or that
 * was removed from the file, is revoked; those revocations are queued for broadcast. Returns the
 * budgets whose period the file changed, for the caller to warn about.
 */
export async function importConfig(
  store: KeyStore,
  cfg: GatewayConfig,
  now = new Date(),
): Promise<BudgetPeriodChange[]> {
  const broadcasts: KeyDeadline[] = [];
  const changes: BudgetPeriodChange[] = [];
  const notePeriod = (scope: BudgetPeriodChange["scope"], id: string, was?: Budget, next?: Budget) => {
    if (was && next && periodChanged(was, next)) {
      changes.push({ scope, id, from: periodName(was.period), to: periodName(next.period) });
    }
  };
  const revoke = async (keyId: string) => {
    const old = await store.revokeKey(keyId, now);
    if (old) broadcasts.push({ at: now, reason: "revoked", keyId, keyHash: old.hash.toString("hex") });
  };
  const declared: string[] = [];
  for (const account of cfg.accounts) {
    await store.putAccount({ accountId: account.id, limits: limitsOf(account.limits), createdAt: now });
    for (const c of account.connections) {
      const connection: ConnectionPolicy = {
        accountId: account.id,
        connectionId: c.id,
        models: c.models,
        defaultModel: c.defaultModel,
        defaultMaxOutputTokens: c.policy.defaultMaxOutputTokens,
        maxOutputTokens: c.policy.maxOutputTokens,
        ...(c.routes ? { routes: c.routes } : {}),
        limits: connectionLimitsOf(c),
        ...budgetOf(c.budget),
        createdAt: now,
      };
      notePeriod("connection", c.id, (await store.connection(account.id, c.id))?.budget, connection.budget);
      await store.putConnection(connection);
      for (const k of c.keys) {
        declared.push(k.id);
        const hash = k.sha256 ? Buffer.from(k.sha256, "hex") : hashKey(k.secret!);
        const existing = await store.findById(k.id);
        if (existing && !existing.hash.equals(hash)) await revoke(k.id);
        const record: KeyRecord = {
          keyId: k.id,
          hash,
          accountId: account.id,
          connectionId: c.id,
          name: "",
          createdAt: now,
          ...(k.expiresAt ? { expiresAt: new Date(k.expiresAt) } : {}),
          last4: k.secret ? k.secret.slice(-4) : "",
          ...budgetOf(k.budget),
        };
        notePeriod("key", k.id, existing?.budget, record.budget);
        await store.importKey(record, k.revoked);
        if (record.expiresAt) {
          broadcasts.push({
            at: record.expiresAt,
            reason: "expired",
            keyId: k.id,
            keyHash: hash.toString("hex"),
          });
        }
      }
    }
  }
  const current = new Set(declared);
  for (const keyId of await store.configKeyIds()) if (!current.has(keyId)) await revoke(keyId);
  await store.addDeadlines(broadcasts);
  // Last: it marks the store seeded, so an import cut short is redone (services/auth-policy/src/reseed.ts).
  await store.setConfigKeyIds(declared);
  return changes;
}
