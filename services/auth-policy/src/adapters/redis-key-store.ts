import { clusterTag, type Redis, RedisDataLostError } from "@tollgate/kit/redis";
import { type Budget, decodeBudget, encodeBudget } from "../domain/budget.js";
import type {
  AccountRecord,
  ConnectionPolicy,
  DeadlineReason,
  KeyDeadline,
  KeyRecord,
  KeyStore,
  RotateRefusal,
} from "../domain/ports.js";

/** Options of the Redis key store. */
export interface RedisKeyStoreOptions {
  /** Prefix of every key this store touches. Default "tollgate:". */
  prefix?: string;
  /**
   * Called when a key lookup finds the store without its seed marker (Redis restarted empty and
   * not re-seeded yet): app.ts starts the re-seed check (services/auth-policy/src/reseed.ts).
   */
  onDataLost?: () => void;
}

// Layout, under <prefix>auth: (ids never contain "/" or "|", so the separators are unambiguous;
// on a Redis Cluster under <prefix>auth:{keys}:, one slot, as the scripts and pipelines below
// touch keys of several accounts and the shared deadlines together)
//   account:<account>              JSON AccountRecord
//   accounts                       SET of account ids (created or imported since the set exists)
//   connection:<account>/<conn>    JSON ConnectionPolicy (budget amount as a decimal string)
//   connections:<account>          SET of connection ids
//   key:<sha256 hex>               HASH key record (never the secret; budget as "<amount>|<period>";
//                                  lineageId only on a key rotated from another)
//   key-id:<key id>                STRING sha256 hex of the key's current secret
//   keys:<account>/<conn>          ZSET key ids by creation time (ms)
//   deadlines                      ZSET "<reason>|<sha256 hex>|<key id>" by due time (ms)
//   config-keys                    SET ids of the keys the configuration file declares
//   config-seeded                  STRING ms of the last completed configuration import (its
//                                  absence on a seeded store means Redis lost its data)

// Stores a new key unless its hash or id exists; queues its expiry.
//   KEYS: record, id index, connection key list, deadlines
//   ARGV: hash hex, key id, created ms, expiry ms or '', expiry member, field/value pairs…
const CREATE_KEY_LUA = `
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('SET', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[4], ARGV[4], ARGV[5]) end
return 1
`;

// Creates or updates a configured key. The file owns connection, name, expiry and budget; an
// existing revocation or rotation stays; "revoked" only ever adds one.
//   KEYS: record, id index, connection key list
//   ARGV: hash hex, key id, now ms, expiry ms or '', '1' if revoked, last4, account, connection,
//         name, budget or ''
const IMPORT_KEY_LUA = `
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'keyId', ARGV[2], 'hash', ARGV[1], 'createdAt', ARGV[3], 'last4', ARGV[6])
end
redis.call('HSET', KEYS[1], 'accountId', ARGV[7], 'connectionId', ARGV[8], 'name', ARGV[9])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'expiresAt', ARGV[4]) else redis.call('HDEL', KEYS[1], 'expiresAt') end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'budget', ARGV[10]) else redis.call('HDEL', KEYS[1], 'budget') end
if ARGV[5] == '1' then redis.call('HSETNX', KEYS[1], 'revokedAt', ARGV[3]) end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', ARGV[3], ARGV[2])
return 1
`;

// Rotates a key in one step: checks the old key, stores the new one, marks the old one rotated
// and queues the end of its grace (and the new key's expiry).
//   KEYS: old record, new record, new id index, connection key list, deadlines
//   ARGV: now ms, grace end ms, new hash hex, new key id, new created ms, new expiry ms or '',
//         new expiry member, grace end member, new record field/value pairs…
//   Returns 1, or -1 unknown, -2 revoked, -3 already rotated, -4 expired, -5 id/hash collision.
const ROTATE_KEY_LUA = `
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local st = redis.call('HMGET', KEYS[1], 'revokedAt', 'rotatedTo', 'expiresAt')
if st[1] then return -2 end
if st[2] then return -3 end
if st[3] and tonumber(st[3]) <= tonumber(ARGV[1]) then return -4 end
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1 then return -5 end
redis.call('HSET', KEYS[2], unpack(ARGV, 9))
redis.call('SET', KEYS[3], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4])
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[5], ARGV[6], ARGV[7]) end
redis.call('HSET', KEYS[1], 'rotatedTo', ARGV[4], 'graceEndsAt', ARGV[2])
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[8])
return 1
`;

// Takes due deadlines: whoever removes them broadcasts them, so each goes out once.
//   KEYS: deadlines   ARGV: now ms, limit
const TAKE_DUE_LUA = `
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local members = {}
for i = 1, #due, 2 do members[#members + 1] = due[i] end
if #members > 0 then redis.call('ZREM', KEYS[1], unpack(members)) end
return due
`;

type WithScripts = Redis & {
  authCreateKey(...args: Array<string | number>): Promise<number>;
  authImportKey(...args: Array<string | number>): Promise<number>;
  authRotateKey(...args: Array<string | number>): Promise<number>;
  authTakeDue(...args: Array<string | number>): Promise<string[]>;
};

const ROTATE_REFUSALS: Record<number, RotateRefusal> = {
  [-1]: "not_found",
  [-2]: "revoked",
  [-3]: "rotated",
  [-4]: "expired",
  [-5]: "conflict",
};

const REASONS: readonly DeadlineReason[] = ["revoked", "rotated", "expired"];

const ms = (d: Date) => String(d.getTime());
const dateOf = (v: string | undefined) => (v === undefined || v === "" ? undefined : new Date(Number(v)));

function fieldsOf(k: KeyRecord): string[] {
  const f = [
    "keyId",
    k.keyId,
    "hash",
    k.hash.toString("hex"),
    "accountId",
    k.accountId,
    "connectionId",
    k.connectionId,
    "name",
    k.name,
    "createdAt",
    ms(k.createdAt),
    "last4",
    k.last4,
  ];
  if (k.expiresAt) f.push("expiresAt", ms(k.expiresAt));
  if (k.revokedAt) f.push("revokedAt", ms(k.revokedAt));
  if (k.rotatedFrom) f.push("rotatedFrom", k.rotatedFrom);
  if (k.lineageId) f.push("lineageId", k.lineageId);
  if (k.rotatedTo) f.push("rotatedTo", k.rotatedTo);
  if (k.graceEndsAt) f.push("graceEndsAt", ms(k.graceEndsAt));
  if (k.budget) f.push("budget", encodeBudget(k.budget));
  return f;
}

function recordOf(h: Record<string, string>): KeyRecord | undefined {
  if (!h["keyId"] || !h["hash"]) return undefined;
  const optional = {
    expiresAt: dateOf(h["expiresAt"]),
    revokedAt: dateOf(h["revokedAt"]),
    rotatedFrom: h["rotatedFrom"] || undefined,
    lineageId: h["lineageId"] || undefined,
    rotatedTo: h["rotatedTo"] || undefined,
    graceEndsAt: dateOf(h["graceEndsAt"]),
    budget: decodeBudget(h["budget"]),
  };
  return {
    keyId: h["keyId"],
    hash: Buffer.from(h["hash"], "hex"),
    accountId: h["accountId"] ?? "",
    connectionId: h["connectionId"] ?? "",
    name: h["name"] ?? "",
    createdAt: dateOf(h["createdAt"]) ?? new Date(0),
    last4: h["last4"] ?? "",
    ...Object.fromEntries(Object.entries(optional).filter(([, v]) => v !== undefined)),
  };
}

const accountJson = (a: AccountRecord) => JSON.stringify({ ...a, createdAt: a.createdAt.getTime() });
const connectionJson = (c: ConnectionPolicy) =>
  JSON.stringify({
    ...c,
    createdAt: c.createdAt.getTime(),
    ...(c.budget ? { budget: { ...c.budget, amount: c.budget.amount.toString() } } : {}),
  });

function accountOf(json: string | null): AccountRecord | undefined {
  if (json === null) return undefined;
  const a = JSON.parse(json) as Omit<AccountRecord, "createdAt"> & { createdAt: number };
  return { ...a, createdAt: new Date(a.createdAt) };
}

function connectionOf(json: string | null): ConnectionPolicy | undefined {
  if (json === null) return undefined;
  const c = JSON.parse(json) as Omit<ConnectionPolicy, "createdAt" | "budget"> & {
    createdAt: number;
    budget?: Omit<Budget, "amount"> & { amount: string };
  };
  const { budget, ...rest } = c;
  return {
    ...rest,
    createdAt: new Date(c.createdAt),
    ...(budget ? { budget: { ...budget, amount: BigInt(budget.amount) } } : {}),
  };
}

const deadlineMember = (d: Pick<KeyDeadline, "reason" | "keyHash" | "keyId">) =>
  `${d.reason}|${d.keyHash}|${d.keyId}`;

function deadlineOf(member: string, score: string): KeyDeadline | undefined {
  const [reason, keyHash, keyId] = member.split("|");
  if (!reason || !keyHash || !keyId || !REASONS.includes(reason as DeadlineReason)) return undefined;
  return { at: new Date(Number(score)), reason: reason as DeadlineReason, keyHash, keyId };
}

type PipelineResult = Array<[Error | null, unknown]> | null;

function results<T>(res: PipelineResult): T[] {
  if (!res) throw new Error("redis pipeline aborted");
  return res.map(([err, value]) => {
    if (err) throw err;
    return value as T;
  });
}

/**
 * Accounts, connections and keys in Redis, shared by every auth-policy replica. Keys are stored
 * only as SHA-256 hashes and looked up by hash; every multi-key change is one Lua script.
 */
export function createRedisKeyStore(redis: Redis, opts: RedisKeyStoreOptions = {}): KeyStore {
  const p = `${opts.prefix ?? "tollgate:"}auth:${clusterTag(redis, "keys")}`;
  const client = redis as WithScripts;
  if (typeof client.authCreateKey !== "function") {
    client.defineCommand("authCreateKey", { numberOfKeys: 4, lua: CREATE_KEY_LUA });
    client.defineCommand("authImportKey", { numberOfKeys: 3, lua: IMPORT_KEY_LUA });
    client.defineCommand("authRotateKey", { numberOfKeys: 5, lua: ROTATE_KEY_LUA });
    client.defineCommand("authTakeDue", { numberOfKeys: 1, lua: TAKE_DUE_LUA });
  }
  const accountKey = (a: string) => `${p}account:${a}`;
  const connectionKey = (a: string, c: string) => `${p}connection:${a}/${c}`;
  const connectionsKey = (a: string) => `${p}connections:${a}`;
  /** Ids of the accounts created or imported since this index exists. */
  const accountsKey = `${p}accounts`;
  const recordKey = (hashHex: string) => `${p}key:${hashHex}`;
  const idKey = (keyId: string) => `${p}key-id:${keyId}`;
  const listKey = (a: string, c: string) => `${p}keys:${a}/${c}`;
  const deadlinesKey = `${p}deadlines`;
  const configKeysKey = `${p}config-keys`;
  const seededKey = `${p}config-seeded`;

  const byHashHex = async (hashHex: string) => recordOf(await redis.hgetall(recordKey(hashHex)));
  const byId = async (keyId: string) => {
    const hashHex = await redis.get(idKey(keyId));
    return hashHex === null ? undefined : byHashHex(hashHex);
  };
  const expiryMember = (k: KeyRecord) =>
    deadlineMember({ reason: "expired", keyHash: k.hash.toString("hex"), keyId: k.keyId });

  return {
    async findByHash(hash) {
      // The key and the seed marker in one read: a key unknown to a store that lost its data may
      // be a configured one not re-seeded yet, so the caller gets a retryable 503, never a 401
      // for a key that works a moment later; and a re-seed (by any replica) is seen whole.
      const [h, marker] = results<unknown>(
        await redis
          .multi()
          .hgetall(recordKey(hash.toString("hex")))
          .exists(seededKey)
          .exec(),
      );
      const record = recordOf(h as Record<string, string>);
      if (record === undefined && marker === 0) {
        opts.onDataLost?.();
        throw new RedisDataLostError("store lost its data (no seed marker): key unknown until re-seeded");
      }
      return record;
    },
    findById: byId,
    async account(accountId) {
      return accountOf(await redis.get(accountKey(accountId)));
    },
    async connection(accountId, connectionId) {
      return connectionOf(await redis.get(connectionKey(accountId, connectionId)));
    },
    async policy(accountId, connectionId) {
      const [a, c] = await redis.mget(accountKey(accountId), connectionKey(accountId, connectionId));
      const connection = connectionOf(c ?? null);
      if (!connection) return undefined;
      const account = accountOf(a ?? null);
      return account ? { connection, account } : { connection };
    },
    async createAccount(account) {
      const ok = (await redis.set(accountKey(account.accountId), accountJson(account), "NX")) === "OK";
      if (ok) await redis.sadd(accountsKey, account.accountId);
      return ok;
    },
    async createConnection(connection) {
      const { accountId, connectionId } = connection;
      const ok = await redis.set(connectionKey(accountId, connectionId), connectionJson(connection), "NX");
      if (ok !== "OK") return false;
      await redis.sadd(connectionsKey(accountId), connectionId);
      return true;
    },
    async putAccount(account) {
      const existing = accountOf(await redis.get(accountKey(account.accountId)));
      const createdAt = existing?.createdAt ?? account.createdAt;
      results(
        await redis
          .multi()
          .set(accountKey(account.accountId), accountJson({ ...account, createdAt }))
          .sadd(accountsKey, account.accountId)
          .exec(),
      );
    },
    async putConnection(connection) {
      const { accountId, connectionId } = connection;
      const existing = connectionOf(await redis.get(connectionKey(accountId, connectionId)));
      const createdAt = existing?.createdAt ?? connection.createdAt;
      results(
        await redis
          .multi()
          .set(connectionKey(accountId, connectionId), connectionJson({ ...connection, createdAt }))
          .sadd(connectionsKey(accountId), connectionId)
          .exec(),
      );
    },
    async createKey(key) {
      const hashHex = key.hash.toString("hex");
      const created = await client.authCreateKey(
        recordKey(hashHex),
        idKey(key.keyId),
        listKey(key.accountId, key.connectionId),
        deadlinesKey,
        hashHex,
        key.keyId,
        ms(key.createdAt),
        key.expiresAt ? ms(key.expiresAt) : "",
        expiryMember(key),
        ...fieldsOf(key),
      );
      return created === 1;
    },
    async importKey(key, revoked) {
      const hashHex = key.hash.toString("hex");
      await client.authImportKey(
        recordKey(hashHex),
        idKey(key.keyId),
        listKey(key.accountId, key.connectionId),
        hashHex,
        key.keyId,
        ms(key.createdAt),
        key.expiresAt ? ms(key.expiresAt) : "",
        revoked ? "1" : "0",
        key.last4,
        key.accountId,
        key.connectionId,
        key.name,
        key.budget ? encodeBudget(key.budget) : "",
      );
    },
    async listKeys(accountId, connectionId) {
      const connectionIds =
        connectionId !== undefined ? [connectionId] : await redis.smembers(connectionsKey(accountId));
      const ids = (
        await Promise.all(connectionIds.map((c) => redis.zrange(listKey(accountId, c), "0", "-1")))
      ).flat();
      if (ids.length === 0) return [];
      const hashes = await redis.mget(ids.map(idKey));
      const pipeline = redis.pipeline();
      for (const h of hashes) if (h) pipeline.hgetall(recordKey(h));
      const records = results<Record<string, string>>(await pipeline.exec())
        .map(recordOf)
        .filter((k): k is KeyRecord => k !== undefined)
        .filter(
          (k) => k.accountId === accountId && (connectionId === undefined || k.connectionId === connectionId),
        );
      return records.sort((a, b) => a.createdAt.getTime() - b.createdAt.getTime());
    },
    async revokeKey(keyId, at) {
      const hashHex = await redis.get(idKey(keyId));
      if (hashHex === null) return undefined;
      // HSETNX keeps the first revocation time when the call is repeated.
      await redis.hsetnx(recordKey(hashHex), "revokedAt", ms(at));
      return byHashHex(hashHex);
    },
    async rotateKey(oldKeyId, fresh, graceEndsAt, now) {
      const oldHashHex = await redis.get(idKey(oldKeyId));
      if (oldHashHex === null) return { ok: false, reason: "not_found" };
      const hashHex = fresh.hash.toString("hex");
      const outcome = await client.authRotateKey(
        recordKey(oldHashHex),
        recordKey(hashHex),
        idKey(fresh.keyId),
        listKey(fresh.accountId, fresh.connectionId),
        deadlinesKey,
        ms(now),
        ms(graceEndsAt),
        hashHex,
        fresh.keyId,
        ms(fresh.createdAt),
        fresh.expiresAt ? ms(fresh.expiresAt) : "",
        expiryMember(fresh),
        deadlineMember({ reason: "rotated", keyHash: oldHashHex, keyId: oldKeyId }),
        ...fieldsOf(fresh),
      );
      if (outcome !== 1) return { ok: false, reason: ROTATE_REFUSALS[outcome] ?? "not_found" };
      const old = await byHashHex(oldHashHex);
      return old ? { ok: true, old } : { ok: false, reason: "not_found" };
    },
    async takeDueDeadlines(now, limit) {
      const flat = await client.authTakeDue(deadlinesKey, ms(now), limit);
      const out: KeyDeadline[] = [];
      for (let i = 0; i + 1 < flat.length; i += 2) {
        const d = deadlineOf(flat[i]!, flat[i + 1]!);
        if (d) out.push(d);
      }
      return out;
    },
    async addDeadlines(list) {
      if (list.length === 0) return;
      await redis.zadd(deadlinesKey, ...list.flatMap((d) => [String(d.at.getTime()), deadlineMember(d)]));
    },
    async listAccounts() {
      const ids = (await redis.smembers(accountsKey)).sort();
      if (ids.length === 0) return [];
      const found = await redis.mget(ids.map(accountKey));
      return found.map((a) => accountOf(a ?? null)).filter((a): a is AccountRecord => a !== undefined);
    },
    async listConnections(accountId) {
      const ids = (await redis.smembers(connectionsKey(accountId))).sort();
      if (ids.length === 0) return [];
      const found = await redis.mget(ids.map((c) => connectionKey(accountId, c)));
      return found.map((c) => connectionOf(c ?? null)).filter((c): c is ConnectionPolicy => c !== undefined);
    },
    async deleteConnection(accountId, connectionId) {
      results(
        await redis
          .multi()
          .del(connectionKey(accountId, connectionId))
          .srem(connectionsKey(accountId), connectionId)
          .exec(),
      );
    },
    async deleteAccount(accountId) {
      results(await redis.multi().del(accountKey(accountId)).srem(accountsKey, accountId).exec());
    },
    async setKeyBudget(keyId, budget) {
      const hashHex = await redis.get(idKey(keyId));
      if (hashHex === null) return undefined;
      if (budget) await redis.hset(recordKey(hashHex), "budget", encodeBudget(budget));
      else await redis.hdel(recordKey(hashHex), "budget");
      return byHashHex(hashHex);
    },
    async configKeyIds() {
      return redis.smembers(configKeysKey);
    },
    async setConfigKeyIds(ids) {
      const tx = redis.multi().del(configKeysKey);
      if (ids.length > 0) tx.sadd(configKeysKey, ...ids);
      tx.set(seededKey, String(Date.now()));
      results(await tx.exec());
    },
    async seeded() {
      return (await redis.exists(seededKey)) === 1;
    },
  };
}
