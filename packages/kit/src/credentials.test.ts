import * as grpc from "@grpc/grpc-js";
import { describe, expect, it } from "vitest";
import { ConfigError } from "./config.js";
import {
  bearerToken,
  decide,
  identityOfCertificate,
  identityOfToken,
  inProcessAuth,
  loadInternalAuth,
  parsePeerTokens,
  peerTokensText,
  tokenAuth,
  tokenDigest,
} from "./credentials.js";

describe("decide", () => {
  const table = { createKey: ["api-edge"], settleReservation: ["api-edge", "metering"] } as const;

  it("serves a listed identity, denies a known one not listed, and refuses no identity", () => {
    expect(decide(table, "createKey", "api-edge")).toBe("allow");
    expect(decide(table, "settleReservation", "metering")).toBe("allow");
    expect(decide(table, "createKey", "metering")).toBe("permission_denied");
    expect(decide(table, "createKey", undefined)).toBe("unauthenticated");
  });

  it("denies a method the table does not name, and never reads the prototype", () => {
    expect(decide(table, "dropEverything", "api-edge")).toBe("permission_denied");
    expect(decide(table, "constructor", "api-edge")).toBe("permission_denied");
  });
});

describe("identityOfCertificate", () => {
  it("prefers the SPIFFE URI SAN", () => {
    expect(
      identityOfCertificate({
        subject: { CN: "metering" } as never,
        subjectaltname: "DNS:x.svc, URI:spiffe://tollgate/api-edge",
      }),
    ).toBe("api-edge");
  });

  it("does not fall back to the CN when the SPIFFE URI names no service", () => {
    expect(
      identityOfCertificate({
        subject: { CN: "api-edge" } as never,
        subjectaltname: "URI:spiffe://tollgate/mallory",
      }),
    ).toBeUndefined();
  });

  it("falls back to the CN, then to a DNS SAN naming a service", () => {
    expect(identityOfCertificate({ subject: { CN: "metering" } as never, subjectaltname: "" })).toBe(
      "metering",
    );
    expect(
      identityOfCertificate({
        subject: { CN: "someone" } as never,
        subjectaltname: "DNS:a.b, DNS:auth-policy",
      }),
    ).toBe("auth-policy");
    expect(
      identityOfCertificate({ subject: { CN: "someone" } as never, subjectaltname: "DNS:a.b" }),
    ).toBeUndefined();
    expect(identityOfCertificate(undefined)).toBeUndefined();
  });
});

describe("tokens", () => {
  it("parses one digest a line, two per peer at most, and names the bad line", () => {
    const peers = parsePeerTokens(
      `# comment\napi-edge=${tokenDigest("a")}\n\napi-edge=${tokenDigest("b")}\n`,
    );
    expect(peers.get("api-edge")).toHaveLength(2);
    expect(() => parsePeerTokens(`mallory=${tokenDigest("a")}`)).toThrow(/line 1: unknown service/);
    expect(() => parsePeerTokens("metering=abc")).toThrow(/line 1/);
    expect(() => parsePeerTokens(peerTokensText({ metering: ["a", "b", "c"] }))).toThrow(/more than two/);
  });

  it("identifies a caller by any of its tokens (old and new during a rotation), and nobody else", () => {
    const peers = parsePeerTokens(peerTokensText({ "api-edge": ["old", "new"], metering: "m" }));
    expect(identityOfToken("old", peers)).toBe("api-edge");
    expect(identityOfToken("new", peers)).toBe("api-edge");
    expect(identityOfToken("m", peers)).toBe("metering");
    expect(identityOfToken("other", peers)).toBeUndefined();
    expect(identityOfToken(undefined, peers)).toBeUndefined();
    expect(identityOfToken("", peers)).toBeUndefined();
  });

  it("reads a bearer token only", () => {
    expect(bearerToken("Bearer abc")).toBe("abc");
    expect(bearerToken("Basic abc")).toBeUndefined();
    expect(bearerToken(Buffer.from("Bearer abc"))).toBeUndefined();
  });

  it("gives each service of one process its own token, known to every peer", () => {
    const all = inProcessAuth();
    const md = new grpc.Metadata();
    all.metering.addCallCredential(md);
    const call = { metadata: md, getAuthContext: () => null };
    expect(all["auth-policy"].identify(call)).toBe("metering");
    expect(String(md.get("authorization")[0])).toMatch(/^Bearer /);
  });
});

describe("tokenAuth on one connection", () => {
  const call = (connection: object, token: string) => ({
    connection,
    metadata: { get: (key: string) => (key === "authorization" ? [`Bearer ${token}`] : []) },
    getAuthContext: () => null,
  });
  const auth = tokenAuth({ peers: parsePeerTokens(peerTokensText({ metering: "good-token" })) });

  it("refuses another token after a proved one on the same connection, and proves each connection itself", () => {
    const a = {};
    const b = {};
    expect(auth.identify(call(a, "good-token"))).toBe("metering");
    expect(auth.identify(call(a, "good-token"))).toBe("metering");
    expect(auth.identify(call(a, "good-tokeN"))).toBeUndefined();
    expect(auth.identify(call(a, ""))).toBeUndefined();
    expect(auth.identify(call(b, "bad-token"))).toBeUndefined();
    expect(auth.identify(call(b, "good-token"))).toBe("metering");
    expect(auth.identify(call(a, "good-token"))).toBe("metering");
  });
});

describe("loadInternalAuth", () => {
  const files: Record<string, string> = {
    "/t": "secret-token\n",
    "/p": peerTokensText({ "api-edge": "x" }),
    "/c": "cert",
    "/k": "key",
    "/a": "ca",
  };
  const read = (p: string) => {
    const v = files[p];
    if (v === undefined) throw new Error(`no file ${p}`);
    return v;
  };
  const role = { server: true, client: true };

  it("refuses to start with nothing configured unless INTERNAL_AUTH=off", () => {
    expect(() => loadInternalAuth({}, role, read)).toThrow(ConfigError);
    expect(() => loadInternalAuth({}, role, read)).toThrow(/INTERNAL_AUTH=off/);
    expect(loadInternalAuth({ INTERNAL_AUTH: "off" }, role, read).mode).toBe("off");
    expect(() => loadInternalAuth({ INTERNAL_AUTH: "maybe" }, role, read)).toThrow(/tls, token or off/);
  });

  it("takes TLS when certificate files are named, and names what is missing", () => {
    expect(
      loadInternalAuth(
        { GRPC_TLS_CERT_FILE: "/c", GRPC_TLS_KEY_FILE: "/k", GRPC_TLS_CA_FILE: "/a" },
        role,
        read,
      ).mode,
    ).toBe("tls");
    expect(() => loadInternalAuth({ GRPC_TLS_CERT_FILE: "/c" }, role, read)).toThrow(
      /GRPC_TLS_KEY_FILE, GRPC_TLS_CA_FILE/,
    );
  });

  it("takes tokens, needing what the role needs, and never puts a token in an error", () => {
    const auth = loadInternalAuth({ INTERNAL_TOKEN_FILE: "/t", INTERNAL_PEER_TOKENS_FILE: "/p" }, role, read);
    expect(auth.mode).toBe("token");
    expect(loadInternalAuth({ INTERNAL_TOKEN_FILE: "/t" }, { server: false, client: true }, read).mode).toBe(
      "token",
    );
    expect(() => loadInternalAuth({ INTERNAL_TOKEN_FILE: "/t" }, role, read)).toThrow(
      /INTERNAL_PEER_TOKENS_FILE/,
    );
    try {
      loadInternalAuth({ INTERNAL_TOKEN_FILE: "/t" }, role, read);
    } catch (err) {
      expect(String(err)).not.toContain("secret-token");
    }
  });
});
