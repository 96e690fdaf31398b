import type { AccountRecord, ConnectionPolicy, KeyRecord, KeyStore } from "../domain/ports.js";

/** Default TTL: a revocation whose broadcast was lost still applies within one second. */
export const DEFAULT_KEY_CACHE_TTL_MS = 1_000;

/** How long and how much a replica keeps. */
export interface KeyCacheOptions {
  /**
   * How long a key record or a connection policy is reused without reading the store again.
   * It bounds how stale a cache can be when a revocation broadcast is lost: keep it ≤ 1 000 ms,
   * the revocation promise (a broadcast, when received, drops a key at once).
   */
  ttlMs: number;
  /** Entries per map; the oldest go first. */
  maxEntries?: number;
  /** Milliseconds clock; tests pass their own. */
  now?: () => number;
}

/** A key store that remembers found keys and policies for a short while. */
export interface CachedKeyStore extends KeyStore {
  /** Drops the key whose secret hashes to `keyHashHex` (a KeyRevoked broadcast). */
  forget(keyHashHex: string): void;
}

interface Entry<T> {
  value: T;
  expiresAt: number;
}

type Policy = { connection: ConnectionPolicy; account?: AccountRecord };

const DEFAULT_MAX_ENTRIES = 10_000;

/** A bounded map whose entries expire; the oldest entry goes when it is full. */
function expiringMap<T>(maxEntries: number, now: () => number) {
  const entries = new Map<string, Entry<T>>();
  return {
    get(id: string): T | undefined {
      const e = entries.get(id);
      if (!e) return undefined;
      if (e.expiresAt > now()) return e.value;
      entries.delete(id);
      return undefined;
    },
    set(id: string, value: T, ttlMs: number) {
      entries.delete(id);
      if (entries.size >= maxEntries) entries.delete(entries.keys().next().value as string);
      entries.set(id, { value, expiresAt: now() + ttlMs });
    },
    delete: (id: string) => entries.delete(id),
    clear: () => entries.clear(),
  };
}

/**
 * Puts a short-lived cache in front of the two reads every Authorize makes (the key by hash and
 * its connection's policy), so an admitted request costs one Redis round trip (the admission
 * script) instead of three. Only found records are cached: a new key works at once. A key is
 * dropped when this replica changes it and when a KeyRevoked broadcast names it; the TTL bounds
 * what a lost broadcast or another replica's policy change can leave stale. Expiry and grace
 * deadlines are decided from the record's own timestamps at each request, so they stay exact.
 */
export function createCachedKeyStore(inner: KeyStore, opts: KeyCacheOptions): CachedKeyStore {
  const now = opts.now ?? Date.now;
  const max = opts.maxEntries ?? DEFAULT_MAX_ENTRIES;
  const keys = expiringMap<KeyRecord>(max, now);
  const policies = expiringMap<Policy>(max, now);
  const policyId = (accountId: string, connectionId: string) => `${accountId}\n${connectionId}`;
  const forgetRecord = (record: KeyRecord | undefined) => {
    if (record) keys.delete(record.hash.toString("hex"));
  };

  return {
    ...inner,
    forget: (keyHashHex) => void keys.delete(keyHashHex),

    async findByHash(hash) {
      const id = hash.toString("hex");
      const cached = keys.get(id);
      if (cached) return cached;
      const record = await inner.findByHash(hash);
      if (record) keys.set(id, record, opts.ttlMs);
      return record;
    },
    async policy(accountId, connectionId) {
      const id = policyId(accountId, connectionId);
      const cached = policies.get(id);
      if (cached) return cached;
      const found = await inner.policy(accountId, connectionId);
      if (found) policies.set(id, found, opts.ttlMs);
      return found;
    },

    // Writes through this replica drop what they change at once.
    async putAccount(account) {
      await inner.putAccount(account);
      policies.clear();
    },
    async putConnection(connection) {
      await inner.putConnection(connection);
      policies.delete(policyId(connection.accountId, connection.connectionId));
    },
    async importKey(key, revoked) {
      await inner.importKey(key, revoked);
      keys.delete(key.hash.toString("hex"));
    },
    async deleteConnection(accountId, connectionId) {
      await inner.deleteConnection(accountId, connectionId);
      policies.delete(policyId(accountId, connectionId));
    },
    async deleteAccount(accountId) {
      await inner.deleteAccount(accountId);
      policies.clear();
    },
    async setKeyBudget(keyId, budget) {
      const record = await inner.setKeyBudget(keyId, budget);
      forgetRecord(record);
      return record;
    },
    async revokeKey(keyId, at) {
      const record = await inner.revokeKey(keyId, at);
      forgetRecord(record);
      return record;
    },
    async rotateKey(oldKeyId, fresh, graceEndsAt, now) {
      const result = await inner.rotateKey(oldKeyId, fresh, graceEndsAt, now);
      if (result.ok) forgetRecord(result.old);
      return result;
    },
  };
}
