import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import type { SecureServerOptions } from "node:http2";
import type { ConnectionOptions, PeerCertificate } from "node:tls";
import { ConfigError } from "./config.js";

/**
 * Who may call an internal gRPC method, and how a caller proves who it is (docs/kubernetes.md, "Internal
 * authentication"). Every server and client of the gateway gets its credentials here.
 *
 * - tls: mutual TLS with certificates from files; the caller's identity is its certificate's
 *   URI SAN spiffe://tollgate/<service>, else its CN or a DNS SAN naming a service.
 * - token: each caller sends its own token (`authorization: Bearer <token>`); the server knows
 *   each peer by the SHA-256 of its tokens (two during a rotation) and compares in constant time.
 * - off: no authentication at all, only when INTERNAL_AUTH=off says so (development only).
 */

/** The service identities of the gateway; nothing else is ever allowed to call. */
export const SERVICE_IDENTITIES = [
  "api-edge",
  "auth-policy",
  "mpp-payment",
  "inference-router",
  "metering",
] as const;
export type ServiceIdentity = (typeof SERVICE_IDENTITIES)[number];

const KNOWN: ReadonlySet<string> = new Set(SERVICE_IDENTITIES);

/** Narrows a string to a known service identity. */
export function isServiceIdentity(name: string): name is ServiceIdentity {
  return KNOWN.has(name);
}

/** The URI SAN prefix of a service certificate: spiffe://tollgate/<service>. */
export const SPIFFE_PREFIX = "spiffe://tollgate/";

/** Metadata key of a token caller's credential. */
export const AUTHORIZATION_KEY = "authorization";

/** Per method (the generated client's local name, e.g. "createKey"): who may call it. */
export type AccessTable<Methods> = { readonly [K in keyof Methods]: readonly ServiceIdentity[] };

/** The outcome of checking one call against a table. */
export type AccessDecision = "allow" | "unauthenticated" | "permission_denied";

/** Decides a call: no identity is unauthenticated, an identity not listed is denied. */
export function decide(
  table: Readonly<Record<string, readonly ServiceIdentity[]>>,
  method: string,
  caller: ServiceIdentity | undefined,
): AccessDecision {
  if (caller === undefined) return "unauthenticated";
  const allowed = Object.hasOwn(table, method) ? table[method] : undefined;
  return allowed?.includes(caller) ? "allow" : "permission_denied";
}

/** The identity a peer certificate names: URI SAN spiffe://tollgate/<service>, else CN, else a DNS SAN. */
export function identityOfCertificate(
  cert: Pick<PeerCertificate, "subject" | "subjectaltname"> | undefined,
): ServiceIdentity | undefined {
  if (!cert) return undefined;
  const sans = (cert.subjectaltname ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  const uris = sans.filter((s) => s.startsWith("URI:")).map((s) => s.slice(4));
  for (const uri of uris) {
    if (uri.startsWith(SPIFFE_PREFIX)) {
      const name = uri.slice(SPIFFE_PREFIX.length);
      // A SPIFFE identity that names no service is not overridden by the CN.
      return isServiceIdentity(name) ? name : undefined;
    }
  }
  const cn = cert.subject?.CN;
  const cns = Array.isArray(cn) ? cn : cn ? [cn] : [];
  for (const name of cns) if (isServiceIdentity(name)) return name;
  for (const s of sans) {
    if (s.startsWith("DNS:")) {
      const name = s.slice(4);
      if (isServiceIdentity(name)) return name;
    }
  }
  return undefined;
}

/** SHA-256 of a token, as the server's peer file holds it (hex). */
export function tokenDigest(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

/** A fresh random token (for the all-in-one process and the local stack). */
export function newToken(): string {
  return randomBytes(32).toString("base64url");
}

/** Each peer's accepted token digests. */
export type PeerDigests = ReadonlyMap<ServiceIdentity, readonly Buffer[]>;

/**
 * Parses a peer token file: one `service=<sha256 hex of its token>` a line, `#` comments. A
 * service may appear twice (old and new token during a rotation). Throws naming the line.
 */
export function parsePeerTokens(text: string): PeerDigests {
  const peers = new Map<ServiceIdentity, Buffer[]>();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith("#")) return;
    const eq = line.indexOf("=");
    const name = eq > 0 ? line.slice(0, eq).trim() : "";
    const hex =
      eq > 0
        ? line
            .slice(eq + 1)
            .trim()
            .toLowerCase()
        : "";
    if (!isServiceIdentity(name)) throw new Error(`peer token file line ${i + 1}: unknown service "${name}"`);
    if (!/^[0-9a-f]{64}$/.test(hex)) {
      throw new Error(`peer token file line ${i + 1}: expected ${name}=<sha256 hex>`);
    }
    const list = peers.get(name) ?? [];
    if (list.length >= 2) throw new Error(`peer token file line ${i + 1}: ${name} has more than two tokens`);
    list.push(Buffer.from(hex, "hex"));
    peers.set(name, list);
  });
  return peers;
}

/** Writes the peer token file's text for these tokens. */
export function peerTokensText(
  tokens: Readonly<Partial<Record<ServiceIdentity, string | readonly string[]>>>,
): string {
  const lines: string[] = [];
  for (const [name, t] of Object.entries(tokens)) {
    for (const token of typeof t === "string" ? [t] : (t ?? [])) lines.push(`${name}=${tokenDigest(token)}`);
  }
  return `${lines.join("\n")}\n`;
}

/**
 * The identity whose digest matches `token`. Every digest is compared (constant time each, no
 * early exit), so the answer's timing does not tell which peer or digest came close.
 */
export function identityOfToken(token: string | undefined, peers: PeerDigests): ServiceIdentity | undefined {
  if (!token) return undefined;
  const presented = createHash("sha256").update(token, "utf8").digest();
  let found: ServiceIdentity | undefined;
  for (const [name, digests] of peers) {
    for (const d of digests) if (timingSafeEqual(presented, d) && found === undefined) found = name;
  }
  return found;
}

/** The token of an `authorization: Bearer <token>` metadata value. */
export function bearerToken(value: unknown): string | undefined {
  if (typeof value !== "string") return undefined;
  const m = /^Bearer\s+(\S+)$/i.exec(value.trim());
  return m?.[1];
}

/** The parts of a server call that identify its caller. */
export interface IncomingCall {
  metadata: { get(key: string): Array<string | Buffer> };
  /** The connection the call came on (the same object for each of its calls), when known. */
  connection?: object;
  getAuthContext(): { sslPeerCertificate?: PeerCertificate } | null;
}

/** How one process authenticates its gRPC servers and clients. */
export interface InternalAuth {
  readonly mode: "tls" | "token" | "off";
  /** The TLS settings of this process's servers (mutual TLS); undefined: plaintext. */
  serverTls(): SecureServerOptions | undefined;
  /** The TLS settings of this process's client connections (mutual TLS); undefined: plaintext. */
  clientTls(): ConnectionOptions | undefined;
  /** Adds this process's credential to an outgoing call's metadata (token mode). */
  addCallCredential(metadata: { set(key: string, value: string): void }): void;
  /** The caller of an incoming call; undefined when it proved nothing. Unused with "off". */
  identify(call: IncomingCall): ServiceIdentity | undefined;
}

/** No authentication: every caller is served. Only with an explicit INTERNAL_AUTH=off. */
export function authOff(): InternalAuth {
  return {
    mode: "off",
    serverTls: () => undefined,
    clientTls: () => undefined,
    addCallCredential: () => {},
    identify: () => undefined,
  };
}

/**
 * Token authentication: `token` is what this process sends when it calls (absent: it calls
 * nothing), `peers` the digests it accepts from its callers.
 */
export function tokenAuth(opts: { token?: string; peers?: PeerDigests }): InternalAuth {
  const peers = opts.peers ?? new Map();
  // The last token each connection proved, and whose it is: its later calls with the same token
  // skip the hash (a service's calls all carry its one token). Gone with the connection.
  const proved = new WeakMap<object, { token: string; identity: ServiceIdentity }>();
  const header = opts.token ? `Bearer ${opts.token}` : undefined;
  return {
    mode: "token",
    serverTls: () => undefined,
    clientTls: () => undefined,
    addCallCredential(metadata) {
      if (header) metadata.set(AUTHORIZATION_KEY, header);
    },
    identify(call) {
      const token = bearerToken(call.metadata.get(AUTHORIZATION_KEY)[0]);
      const connection = call.connection;
      const last = connection && proved.get(connection);
      // Compared with a token this same connection sent and proved before: the comparison's
      // timing tells the caller nothing it did not send itself.
      if (last && token !== undefined && last.token === token) return last.identity;
      const identity = identityOfToken(token, peers);
      if (connection && token !== undefined && identity !== undefined)
        proved.set(connection, { token, identity });
      return identity;
    },
  };
}

/**
 * Mutual TLS: servers require a client certificate signed by `ca` (which may hold two CAs during
 * a rotation); clients present theirs and accept any server whose certificate, signed by `ca`,
 * names a gateway service (the address may be a pod IP or a headless name, so no hostname check).
 */
export function tlsAuth(opts: { cert: Buffer; key: Buffer; ca: Buffer }): InternalAuth {
  return {
    mode: "tls",
    serverTls: () => ({
      ca: opts.ca,
      cert: opts.cert,
      key: opts.key,
      requestCert: true,
      rejectUnauthorized: true,
    }),
    clientTls: () => ({
      ca: opts.ca,
      cert: opts.cert,
      key: opts.key,
      ALPNProtocols: ["h2"],
      checkServerIdentity: (_host: string, cert: PeerCertificate) =>
        identityOfCertificate(cert) ? undefined : new Error("server certificate names no tollgate service"),
    }),
    addCallCredential: () => {},
    identify: (call) => identityOfCertificate(call.getAuthContext()?.sslPeerCertificate),
  };
}

/** Thrown when a process's internal authentication is missing or half configured. */
export class InternalAuthConfigError extends ConfigError {
  constructor(message: string) {
    super([message]);
  }
}

/** The environment variables of internal authentication. */
export interface InternalAuthEnv {
  INTERNAL_AUTH?: string | undefined;
  GRPC_TLS_CERT_FILE?: string | undefined;
  GRPC_TLS_KEY_FILE?: string | undefined;
  GRPC_TLS_CA_FILE?: string | undefined;
  INTERNAL_TOKEN_FILE?: string | undefined;
  INTERNAL_PEER_TOKENS_FILE?: string | undefined;
}

const set = (v: string | undefined): v is string => v !== undefined && v !== "";

/**
 * Builds a process's internal authentication from its environment: TLS when GRPC_TLS_CERT_FILE
 * is set, else tokens when INTERNAL_TOKEN_FILE or INTERNAL_PEER_TOKENS_FILE is; with neither,
 * the process refuses to start unless INTERNAL_AUTH=off. `role` says what this process needs:
 * a server needs its peers' digests, a client its own token.
 */
export function loadInternalAuth(
  env: InternalAuthEnv,
  role: { server: boolean; client: boolean },
  read: (path: string) => string = (p) => readFileSync(p, "utf8"),
): InternalAuth {
  const mode = env.INTERNAL_AUTH?.trim().toLowerCase();
  if (set(mode) && !["off", "tls", "token"].includes(mode)) {
    throw new InternalAuthConfigError(`INTERNAL_AUTH must be tls, token or off, not "${env.INTERNAL_AUTH}"`);
  }
  if (mode === "off") return authOff();
  const tls = set(env.GRPC_TLS_CERT_FILE) || set(env.GRPC_TLS_KEY_FILE) || set(env.GRPC_TLS_CA_FILE);
  const tokens = set(env.INTERNAL_TOKEN_FILE) || set(env.INTERNAL_PEER_TOKENS_FILE);
  if (mode === "tls" || (!set(mode) && tls)) {
    const missing = (["GRPC_TLS_CERT_FILE", "GRPC_TLS_KEY_FILE", "GRPC_TLS_CA_FILE"] as const).filter(
      (k) => !set(env[k]),
    );
    if (missing.length) throw new InternalAuthConfigError(`mutual TLS needs ${missing.join(", ")}`);
    const buf = (p: string) => Buffer.from(read(p), "utf8");
    return tlsAuth({
      cert: buf(env.GRPC_TLS_CERT_FILE!),
      key: buf(env.GRPC_TLS_KEY_FILE!),
      ca: buf(env.GRPC_TLS_CA_FILE!),
    });
  }
  if (mode === "token" || (!set(mode) && tokens)) {
    const missing: string[] = [];
    if (role.client && !set(env.INTERNAL_TOKEN_FILE)) missing.push("INTERNAL_TOKEN_FILE");
    if (role.server && !set(env.INTERNAL_PEER_TOKENS_FILE)) missing.push("INTERNAL_PEER_TOKENS_FILE");
    if (missing.length) throw new InternalAuthConfigError(`token authentication needs ${missing.join(", ")}`);
    const token = role.client ? read(env.INTERNAL_TOKEN_FILE!).trim() : undefined;
    if (role.client && !token) throw new InternalAuthConfigError("INTERNAL_TOKEN_FILE is empty");
    return tokenAuth({
      ...(token ? { token } : {}),
      ...(role.server ? { peers: parsePeerTokens(read(env.INTERNAL_PEER_TOKENS_FILE!)) } : {}),
    });
  }
  throw new InternalAuthConfigError(
    "no internal authentication configured: set GRPC_TLS_CERT_FILE, GRPC_TLS_KEY_FILE and GRPC_TLS_CA_FILE " +
      "(mutual TLS) or INTERNAL_TOKEN_FILE / INTERNAL_PEER_TOKENS_FILE (tokens); INTERNAL_AUTH=off runs " +
      "without authentication, for development only",
  );
}

/** The environment keys of internal authentication, for each service's env schema. */
export const INTERNAL_AUTH_ENV_KEYS = [
  "INTERNAL_AUTH",
  "GRPC_TLS_CERT_FILE",
  "GRPC_TLS_KEY_FILE",
  "GRPC_TLS_CA_FILE",
  "INTERNAL_TOKEN_FILE",
  "INTERNAL_PEER_TOKENS_FILE",
] as const;

/**
 * Throw-away per-service tokens for one process that runs every service (the all-in-one): each
 * service gets its own token and knows every peer's digest. Nothing is written anywhere.
 */
export function inProcessAuth(): Record<ServiceIdentity, InternalAuth> {
  const tokens = Object.fromEntries(SERVICE_IDENTITIES.map((s) => [s, newToken()])) as Record<
    ServiceIdentity,
    string
  >;
  const peers = parsePeerTokens(peerTokensText(tokens));
  return Object.fromEntries(
    SERVICE_IDENTITIES.map((s) => [s, tokenAuth({ token: tokens[s], peers })]),
  ) as Record<ServiceIdentity, InternalAuth>;
}
