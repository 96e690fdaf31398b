import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { keyStoreContract } from "../../test/key-store-contract.js";
import type { ConnectionPolicy, KeyRecord, KeyStore } from "../domain/ports.js";
import { createCachedKeyStore } from "./cached-key-store.js";
import { createMemoryKeyStore } from "./memory-key-store.js";

const TTL = 1_000;

/** A memory store that counts the reads the cache should save. */
function counted(inner: KeyStore) {
  const reads = { findByHash: 0, policy: 0 };
  const store: KeyStore = {
    ...inner,
    findByHash(hash) {
      reads.findByHash++;
      return inner.findByHash(hash);
    },
    policy(a, c) {
      reads.policy++;
      return inner.policy(a, c);
    },
  };
  return { store, reads };
}

function fixture() {
  let clock = 1_700_000_000_000;
  const backing = counted(createMemoryKeyStore());
  const cache = createCachedKeyStore(backing.store, { ttlMs: TTL, maxEntries: 3, now: () => clock });
  const tick = (ms: number) => {
    clock += ms;
  };
  return { cache, backing, tick };
}

const hashOf = (secret: string) => createHash("sha256").update(secret).digest();

function key(id: string): KeyRecord {
  return {
    keyId: id,
    hash: hashOf(`secret-${id}`),
    accountId: "acme",
    connectionId: "prod",
    name: "",
    createdAt: new Date(0),
    last4: "",
  };
}

const connection: ConnectionPolicy = {
  accountId: "acme",
  connectionId: "prod",
  models: ["m"],
  defaultModel: "m",
  defaultMaxOutputTokens: 16,
  maxOutputTokens: 64,
  limits: { connection: {}, perKey: {}, routes: {} },
  createdAt: new Date(0),
};

describe("cached key store", () => {
  describe("keeps the key store contract", () => {
    keyStoreContract(() => createCachedKeyStore(createMemoryKeyStore(), { ttlMs: TTL }));
  });

  it("reads a key and its policy once per TTL, then again", async () => {
    const { cache, backing, tick } = fixture();
    await cache.putConnection(connection);
    await cache.createKey(key("k1"));
    for (let i = 0; i < 5; i++) {
      expect((await cache.findByHash(hashOf("secret-k1")))?.keyId).toBe("k1");
      expect((await cache.policy("acme", "prod"))?.connection.defaultModel).toBe("m");
    }
    expect(backing.reads).toEqual({ findByHash: 1, policy: 1 });
    tick(TTL);
    await cache.findByHash(hashOf("secret-k1"));
    await cache.policy("acme", "prod");
    expect(backing.reads).toEqual({ findByHash: 2, policy: 2 });
  });

  it("never caches a miss: a key created on another replica works at once", async () => {
    const { cache, backing } = fixture();
    expect(await cache.findByHash(hashOf("secret-k2"))).toBeUndefined();
    await backing.store.createKey(key("k2"));
    expect((await cache.findByHash(hashOf("secret-k2")))?.keyId).toBe("k2");
  });

  it("sees a revocation through this replica at once", async () => {
    const { cache } = fixture();
    await cache.createKey(key("k3"));
    await cache.findByHash(hashOf("secret-k3"));
    await cache.revokeKey("k3", new Date(5));
    expect((await cache.findByHash(hashOf("secret-k3")))?.revokedAt).toEqual(new Date(5));
  });

  it("sees a revocation on another replica at its broadcast, or within the TTL when the broadcast is lost", async () => {
    const { cache, backing, tick } = fixture();
    await cache.createKey(key("k4"));
    await cache.createKey(key("k5"));
    await cache.findByHash(hashOf("secret-k4"));
    await cache.findByHash(hashOf("secret-k5"));
    await backing.store.revokeKey("k4", new Date(7));
    await backing.store.revokeKey("k5", new Date(7));

    cache.forget(hashOf("secret-k4").toString("hex"));
    expect((await cache.findByHash(hashOf("secret-k4")))?.revokedAt).toEqual(new Date(7));

    expect((await cache.findByHash(hashOf("secret-k5")))?.revokedAt).toBeUndefined();
    tick(TTL);
    expect((await cache.findByHash(hashOf("secret-k5")))?.revokedAt).toEqual(new Date(7));
  });

  it("holds at most maxEntries keys, dropping the oldest", async () => {
    const { cache, backing } = fixture();
    for (const id of ["a", "b", "c", "d"]) {
      await cache.createKey(key(id));
      await cache.findByHash(hashOf(`secret-${id}`));
    }
    expect(backing.reads.findByHash).toBe(4);
    await cache.findByHash(hashOf("secret-d"));
    expect(backing.reads.findByHash).toBe(4);
    await cache.findByHash(hashOf("secret-a"));
    expect(backing.reads.findByHash).toBe(5);
  });
});
