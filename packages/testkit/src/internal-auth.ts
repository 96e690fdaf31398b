import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  type InternalAuth,
  newToken,
  parsePeerTokens,
  peerTokensText,
  SERVICE_IDENTITIES,
  type ServiceIdentity,
  tlsAuth,
  tokenAuth,
} from "@tollgate/kit/credentials";

/** Per-service tokens written to files, as the local stack hands them to its processes. */
export interface StackTokens {
  /** The file of every peer's token digest (INTERNAL_PEER_TOKENS_FILE). */
  peersFile: string;
  /** The file of one service's own token (INTERNAL_TOKEN_FILE). */
  tokenFile(name: ServiceIdentity): string;
  /** Credentials acting as `name`, for a test that calls a service directly. */
  as(name: ServiceIdentity): InternalAuth;
}

/**
 * Writes a fresh random token per service into `<dir>/internal-auth/` (owner-only files) and
 * the digest file every server reads. The tokens never leave the directory, which the stack
 * removes when it stops (`make down` for the detached stack of `make up`).
 */
export function writeStackTokens(dir: string): StackTokens {
  const root = join(dir, "internal-auth");
  mkdirSync(root, { recursive: true, mode: 0o700 });
  const tokens = Object.fromEntries(SERVICE_IDENTITIES.map((s) => [s, newToken()])) as Record<
    ServiceIdentity,
    string
  >;
  const peersFile = join(root, "peers");
  writeFileSync(peersFile, peerTokensText(tokens), { mode: 0o600 });
  for (const s of SERVICE_IDENTITIES)
    writeFileSync(join(root, `${s}.token`), `${tokens[s]}\n`, { mode: 0o600 });
  const peers = parsePeerTokens(readFileSync(peersFile, "utf8"));
  return {
    peersFile,
    tokenFile: (name) => join(root, `${name}.token`),
    as: (name) => tokenAuth({ token: tokens[name], peers }),
  };
}

/** A throw-away certificate authority and one certificate per name, made with openssl. */
export interface TestPki {
  caFile: string;
  certFile(name: string): string;
  keyFile(name: string): string;
  /** mTLS credentials presenting `name`'s certificate. */
  as(name: string): InternalAuth;
}

function openssl(args: string[]): void {
  execFileSync("openssl", args, { stdio: ["ignore", "ignore", "pipe"] });
}

/**
 * Creates a CA in `dir` and, for each entry, a certificate it signs: `uri` puts a URI SAN
 * (spiffe://tollgate/<service>), `cn` the subject CN. `otherCaNames` are signed by a second,
 * untrusted CA (to show a certificate from elsewhere is refused).
 */
export function makeTestPki(
  dir: string,
  certs: ReadonlyArray<{ name: string; uri?: string; cn?: string; untrusted?: boolean }>,
): TestPki {
  mkdirSync(dir, { recursive: true });
  const caKey = join(dir, "ca.key");
  const caFile = join(dir, "ca.crt");
  const rogueKey = join(dir, "rogue-ca.key");
  const rogueCa = join(dir, "rogue-ca.crt");
  for (const [key, crt, cn] of [
    [caKey, caFile, "tollgate test CA"],
    [rogueKey, rogueCa, "someone else's CA"],
  ] as const) {
    openssl(["req", "-x509", ...newEcKey(key), "-out", crt, "-days", "2", "-subj", `/CN=${cn}`]);
  }
  for (const c of certs) {
    const key = join(dir, `${c.name}.key`);
    const csr = join(dir, `${c.name}.csr`);
    const crt = join(dir, `${c.name}.crt`);
    const ext = join(dir, `${c.name}.ext`);
    const sans = [c.uri ? `URI:${c.uri}` : "", "DNS:localhost", "IP:127.0.0.1"].filter(Boolean).join(",");
    writeFileSync(ext, `subjectAltName=${sans}\nextendedKeyUsage=serverAuth,clientAuth\n`);
    openssl(["req", "-new", ...newEcKey(key), "-out", csr, "-subj", `/CN=${c.cn ?? "unnamed"}`]);
    openssl([
      "x509",
      "-req",
      "-in",
      csr,
      "-CA",
      c.untrusted ? rogueCa : caFile,
      "-CAkey",
      c.untrusted ? rogueKey : caKey,
      "-CAcreateserial",
      "-out",
      crt,
      "-days",
      "2",
      "-extfile",
      ext,
    ]);
  }
  const ca = readFileSync(caFile);
  return {
    caFile,
    certFile: (name) => join(dir, `${name}.crt`),
    keyFile: (name) => join(dir, `${name}.key`),
    as: (name) =>
      tlsAuth({
        cert: readFileSync(join(dir, `${name}.crt`)),
        key: readFileSync(join(dir, `${name}.key`)),
        ca,
      }),
  };
}

/** `openssl req` arguments for a fresh unencrypted P-256 key written to `keyFile`. */
function newEcKey(keyFile: string): string[] {
  return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", keyFile];
}
