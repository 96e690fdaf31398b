import type { GatewayConfig } from "@tollgate/config";
import { hashKey } from "../domain/keys.js";
import type { ConnectionPolicy, KeyRecord, KeyStore } from "../domain/ports.js";

/**
 * Keys and connections from the configuration file, held in memory. Clear-text development
 * keys are hashed on load and the clear text is dropped.
 */
export function createConfigKeyStore(cfg: GatewayConfig): KeyStore {
  const keys = new Map<string, KeyRecord>();
  const connections = new Map<string, ConnectionPolicy>();
  for (const account of cfg.accounts) {
    for (const c of account.connections) {
      connections.set(`${account.id}/${c.id}`, {
        accountId: account.id,
        connectionId: c.id,
        models: c.models,
        defaultModel: c.defaultModel,
        defaultMaxOutputTokens: c.policy.defaultMaxOutputTokens,
        maxOutputTokens: c.policy.maxOutputTokens,
      });
      for (const k of c.keys) {
        const hash = k.sha256 ? Buffer.from(k.sha256, "hex") : hashKey(k.secret!);
        keys.set(hash.toString("hex"), {
          keyId: k.id,
          hash,
          accountId: account.id,
          connectionId: c.id,
          ...(k.expiresAt ? { expiresAt: new Date(k.expiresAt) } : {}),
          revoked: k.revoked,
        });
      }
    }
  }
  return {
    async findByHash(hash) {
      return keys.get(hash.toString("hex"));
    },
    async connection(accountId, connectionId) {
      return connections.get(`${accountId}/${connectionId}`);
    },
  };
}
