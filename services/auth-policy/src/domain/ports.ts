/** A Virtual Key as stored: never the secret, only its hash and what it grants. */
export interface KeyRecord {
  keyId: string;
  hash: Buffer;
  accountId: string;
  connectionId: string;
  expiresAt?: Date;
  revoked: boolean;
}

/** The policy of one account connection. */
export interface ConnectionPolicy {
  accountId: string;
  connectionId: string;
  /** Public model ids, in configuration order. */
  models: readonly string[];
  defaultModel: string;
  defaultMaxOutputTokens: number;
  maxOutputTokens: number;
}

/** Where keys and connections are looked up. */
export interface KeyStore {
  /** Finds a key by the SHA-256 of its secret. */
  findByHash(hash: Buffer): Promise<KeyRecord | undefined>;
  /** Returns the policy of a connection. */
  connection(accountId: string, connectionId: string): Promise<ConnectionPolicy | undefined>;
}
