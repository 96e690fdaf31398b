import type { AccountRecord, ConnectionPolicy, KeyDeadline, KeyRecord, KeyStore } from "../domain/ports.js";

const copy = (k: KeyRecord): KeyRecord => ({ ...k });
const deadlineId = (d: KeyDeadline) => `${d.reason}|${d.keyHash}|${d.keyId}`;

/**
 * Accounts, connections and keys in this process's memory: the store of the all-in-one process
 * without REDIS_URL, with the same semantics as the Redis store.
 */
export function createMemoryKeyStore(): KeyStore {
  const accounts = new Map<string, AccountRecord>();
  const connections = new Map<string, ConnectionPolicy>();
  const byHash = new Map<string, KeyRecord>();
  const hashById = new Map<string, string>();
  const deadlines = new Map<string, KeyDeadline>();
  let configIds: string[] = [];
  let seeded = false;

  const connKey = (a: string, c: string) => `${a}/${c}`;
  const recordById = (keyId: string) => {
    const hash = hashById.get(keyId);
    return hash === undefined ? undefined : byHash.get(hash);
  };
  const queue = (d: KeyDeadline) => deadlines.set(deadlineId(d), d);

  return {
    async findByHash(hash) {
      const k = byHash.get(hash.toString("hex"));
      return k && copy(k);
    },
    async findById(keyId) {
      const k = recordById(keyId);
      return k && copy(k);
    },
    async account(accountId) {
      return accounts.get(accountId);
    },
    async connection(accountId, connectionId) {
      return connections.get(connKey(accountId, connectionId));
    },
    async policy(accountId, connectionId) {
      const connection = connections.get(connKey(accountId, connectionId));
      if (!connection) return undefined;
      const account = accounts.get(accountId);
      return account ? { connection, account } : { connection };
    },
    async createAccount(account) {
      if (accounts.has(account.accountId)) return false;
      accounts.set(account.accountId, account);
      return true;
    },
    async createConnection(connection) {
      const id = connKey(connection.accountId, connection.connectionId);
      if (connections.has(id)) return false;
      connections.set(id, connection);
      return true;
    },
    async putAccount(account) {
      const createdAt = accounts.get(account.accountId)?.createdAt ?? account.createdAt;
      accounts.set(account.accountId, { ...account, createdAt });
    },
    async putConnection(connection) {
      const id = connKey(connection.accountId, connection.connectionId);
      const createdAt = connections.get(id)?.createdAt ?? connection.createdAt;
      connections.set(id, { ...connection, createdAt });
    },
    async createKey(key) {
      const hash = key.hash.toString("hex");
      if (byHash.has(hash) || hashById.has(key.keyId)) return false;
      byHash.set(hash, copy(key));
      hashById.set(key.keyId, hash);
      if (key.expiresAt) queue({ at: key.expiresAt, reason: "expired", keyId: key.keyId, keyHash: hash });
      return true;
    },
    async importKey(key, revoked) {
      const hash = key.hash.toString("hex");
      const existing = byHash.get(hash);
      const next: KeyRecord = existing
        ? { ...existing, accountId: key.accountId, connectionId: key.connectionId, name: key.name }
        : copy(key);
      if (key.expiresAt) next.expiresAt = key.expiresAt;
      else delete next.expiresAt;
      if (key.budget) next.budget = key.budget;
      else delete next.budget;
      if (revoked && !next.revokedAt) next.revokedAt = key.createdAt;
      byHash.set(hash, next);
      hashById.set(key.keyId, hash);
    },
    async listKeys(accountId, connectionId) {
      const out: KeyRecord[] = [];
      for (const hash of hashById.values()) {
        const k = byHash.get(hash);
        if (!k || k.accountId !== accountId) continue;
        if (connectionId !== undefined && k.connectionId !== connectionId) continue;
        out.push(copy(k));
      }
      return out.sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime());
    },
    async revokeKey(keyId, at) {
      const k = recordById(keyId);
      if (!k) return undefined;
      k.revokedAt ??= at;
      return copy(k);
    },
    async rotateKey(oldKeyId, fresh, graceEndsAt, now) {
      const old = recordById(oldKeyId);
      if (!old) return { ok: false, reason: "not_found" };
      if (old.revokedAt) return { ok: false, reason: "revoked" };
      if (old.rotatedTo) return { ok: false, reason: "rotated" };
      if (old.expiresAt && old.expiresAt.getTime() <= now.getTime()) return { ok: false, reason: "expired" };
      const hash = fresh.hash.toString("hex");
      if (byHash.has(hash) || hashById.has(fresh.keyId)) return { ok: false, reason: "conflict" };
      byHash.set(hash, copy(fresh));
      hashById.set(fresh.keyId, hash);
      if (fresh.expiresAt)
        queue({ at: fresh.expiresAt, reason: "expired", keyId: fresh.keyId, keyHash: hash });
      old.rotatedTo = fresh.keyId;
      old.graceEndsAt = graceEndsAt;
      queue({ at: graceEndsAt, reason: "rotated", keyId: old.keyId, keyHash: old.hash.toString("hex") });
      return { ok: true, old: copy(old) };
    },
    async takeDueDeadlines(now, limit) {
      const due = [...deadlines.values()]
        .filter((d) => d.at.getTime() <= now.getTime())
        .sort((a, b) => a.at.getTime() - b.at.getTime())
        .slice(0, limit);
      for (const d of due) deadlines.delete(deadlineId(d));
      return due;
    },
    async addDeadlines(list) {
      for (const d of list) queue(d);
    },
    async listAccounts() {
      return [...accounts.values()].sort((a, b) => (a.accountId < b.accountId ? -1 : 1));
    },
    async listConnections(accountId) {
      return [...connections.values()]
        .filter((c) => c.accountId === accountId)
        .sort((a, b) => (a.connectionId < b.connectionId ? -1 : 1));
    },
    async deleteConnection(accountId, connectionId) {
      connections.delete(connKey(accountId, connectionId));
    },
    async deleteAccount(accountId) {
      accounts.delete(accountId);
    },
    async setKeyBudget(keyId, budget) {
      const k = recordById(keyId);
      if (!k) return undefined;
      if (budget) k.budget = budget;
      else delete k.budget;
      return copy(k);
    },
    async configKeyIds() {
      return [...configIds];
    },
    async setConfigKeyIds(ids) {
      configIds = [...ids];
      seeded = true;
    },
    async seeded() {
      return seeded;
    },
  };
}
