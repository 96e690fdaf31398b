import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { DescMethod } from "@bufbuild/protobuf";
import type { GenService, GenServiceMethods } from "@bufbuild/protobuf/codegenv2";
import { authAccess } from "@tollgate/auth-policy/access";
import { inferenceAccess } from "@tollgate/inference-router/access";
import {
  type InternalAuth,
  parsePeerTokens,
  peerTokensText,
  SERVICE_IDENTITIES,
  type ServiceIdentity,
  tokenAuth,
} from "@tollgate/kit/credentials";
import {
  createClient,
  type GrpcServer,
  GrpcStatus,
  implement,
  RemoteError,
  serveGrpc,
} from "@tollgate/kit/grpc";
import { checkGrpcHealth } from "@tollgate/kit/health";
import { inProcessClient } from "@tollgate/kit/in-process";
import { createLogger } from "@tollgate/kit/log";
import { meteringAccess } from "@tollgate/metering/access";
import { paymentAccess } from "@tollgate/mpp-payment/access";
import { AuthService } from "@tollgate/proto/auth";
import { InferenceService } from "@tollgate/proto/inference";
import { MeteringService } from "@tollgate/proto/metering";
import { PaymentService } from "@tollgate/proto/payment";
import { makeTestPki, type TestPki } from "@tollgate/testkit/internal-auth";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * Every method of every internal service, generated from the services' own access tables
 * (services/<name>/src/transport/grpc/access.ts): no credential is refused, a service the table
 * does not name is denied, and each named one is served. A method added to a proto without a
 * table entry fails here (its allowed caller set is empty, so nothing is served).
 */
const SERVICES: ReadonlyArray<{
  name: ServiceIdentity;
  service: GenService<GenServiceMethods>;
  access: Readonly<Record<string, readonly ServiceIdentity[]>>;
}> = [
  { name: "auth-policy", service: AuthService as never, access: authAccess },
  { name: "mpp-payment", service: PaymentService as never, access: paymentAccess },
  { name: "inference-router", service: InferenceService as never, access: inferenceAccess },
  { name: "metering", service: MeteringService as never, access: meteringAccess },
];

const log = createLogger({ service: "internal-auth-test", level: "silent" });

/**
 * The "Who may call what" table of docs/runbooks/internal-auth.md, read back: each method (by
 * its proto name, as the table writes it) of each service, and the callers the table names.
 */
function documentedAccess(): Map<string, string[]> {
  const text = readFileSync(new URL("../../../docs/runbooks/internal-auth.md", import.meta.url), "utf8");
  const table = text.slice(text.indexOf("| service | method | callers |"));
  const rows = new Map<string, string[]>();
  for (const line of table.split("\n").slice(2)) {
    if (!line.startsWith("|")) break;
    const [service, methods, callers] = line
      .split("|")
      .slice(1, 4)
      .map((c) => c.trim());
    const who = callers!
      .replace(/\([^)]*\)/g, "")
      .split(",")
      .map((c) => c.trim())
      .sort();
    for (const [, method] of methods!.matchAll(/`(\w+)`/g)) rows.set(`${service} ${method}`, who);
  }
  return rows;
}

/** Handlers that answer every method with an empty message: only the access check matters here. */
function emptyHandlers(service: GenService<GenServiceMethods>): never {
  const handlers: Record<string, unknown> = {};
  for (const m of service.methods as DescMethod[]) {
    handlers[m.localName] =
      m.methodKind === "server_streaming"
        ? async function* () {
            /* an empty stream */
          }
        : async () => ({});
  }
  return handlers as never;
}

/** The gRPC status a call ended with (OK when it was served). */
async function statusOf(
  entry: (typeof SERVICES)[number],
  address: string,
  method: DescMethod,
  auth: InternalAuth | undefined,
): Promise<GrpcStatus> {
  const client = createClient(entry.service, address, auth) as unknown as Record<
    string,
    (req: object, opts: object) => Promise<unknown> | AsyncIterable<unknown>
  > & { $close(): void };
  try {
    const call = client[method.localName]!({}, { timeoutMs: 5_000 });
    if (method.methodKind === "server_streaming") {
      for await (const _ of call as AsyncIterable<unknown>) {
        /* drain */
      }
    } else await call;
    return GrpcStatus.OK;
  } catch (err) {
    if (err instanceof RemoteError) return err.status;
    throw err;
  } finally {
    client.$close();
  }
}

function cases() {
  return SERVICES.flatMap((entry) =>
    (entry.service.methods as DescMethod[]).map((method) => {
      const allowed = entry.access[method.localName] ?? [];
      const other = SERVICE_IDENTITIES.find((s) => !allowed.includes(s));
      return { entry, method, allowed, other, label: `${entry.service.typeName}/${method.name}` };
    }),
  );
}

/** Runs the table-driven checks against servers built with `serverAuth`, callers with `as`. */
function suite(
  mode: string,
  setup: () => {
    server: (s: ServiceIdentity) => InternalAuth;
    as: (s: ServiceIdentity) => InternalAuth;
    none: InternalAuth | undefined;
  },
) {
  describe(`internal calls over ${mode}`, () => {
    const servers = new Map<ServiceIdentity, GrpcServer>();
    let ctx: ReturnType<typeof setup>;

    beforeAll(async () => {
      ctx = setup();
      for (const entry of SERVICES) {
        servers.set(
          entry.name,
          await serveGrpc({
            host: "127.0.0.1",
            port: 0,
            log,
            auth: ctx.server(entry.name),
            services: [implement(entry.service, emptyHandlers(entry.service), entry.access as never)],
            healthPort: 0,
          }),
        );
      }
    });

    afterAll(async () => {
      for (const s of servers.values()) await s.stop(1_000);
    });

    const addr = (name: ServiceIdentity) => `127.0.0.1:${servers.get(name)!.port}`;

    it.each(cases())("$label: no credential is refused", async ({ entry, method }) => {
      const status = await statusOf(entry, addr(entry.name), method, ctx.none);
      // Tokens: UNAUTHENTICATED from the check. mTLS: a client without a certificate does not
      // get past the handshake (UNAVAILABLE); either way, no handler ran.
      expect([GrpcStatus.UNAUTHENTICATED, ...(mode === "mTLS" ? [GrpcStatus.UNAVAILABLE] : [])]).toContain(
        status,
      );
    });

    it.each(cases())("$label: every identity it lists is served", async ({ entry, method, allowed }) => {
      expect(allowed.length, "the method has an entry in its service's access table").toBeGreaterThan(0);
      for (const who of allowed)
        expect(await statusOf(entry, addr(entry.name), method, ctx.as(who)), who).toBe(GrpcStatus.OK);
    });

    it.each(cases().filter((c) => c.other))(
      "$label: another service is denied",
      async ({ entry, method, other }) => {
        expect(await statusOf(entry, addr(entry.name), method, ctx.as(other!))).toBe(
          GrpcStatus.PERMISSION_DENIED,
        );
      },
    );

    it("keeps grpc.health.v1 open, on the service port (tokens) and the plaintext probe port", async () => {
      for (const [, s] of servers) {
        expect(await checkGrpcHealth(`127.0.0.1:${s.healthPort}`)).toBe("SERVING");
        if (mode === "tokens") expect(await checkGrpcHealth(`127.0.0.1:${s.port}`)).toBe("SERVING");
      }
    });
  });
}

suite("tokens", () => {
  const tokens = Object.fromEntries(SERVICE_IDENTITIES.map((s) => [s, `token-of-${s}-${Math.random()}`]));
  const peers = parsePeerTokens(peerTokensText(tokens));
  return {
    server: () => tokenAuth({ peers }),
    as: (s) => tokenAuth({ token: tokens[s]!, peers }),
    none: undefined,
  };
});

describe("the runbook's table of who may call what", () => {
  it("names every method of every internal service with the callers its access table allows", () => {
    const actual = new Map<string, string[]>();
    for (const { name, service, access } of SERVICES) {
      for (const m of service.methods as DescMethod[]) {
        actual.set(`${name} ${m.name}`, [...(access[m.localName] ?? [])].sort());
      }
    }
    expect(Object.fromEntries(documentedAccess())).toEqual(Object.fromEntries(actual));
  });
});

describe("internal calls in process (the all-in-one)", () => {
  /** The status of one call through kit's in-process client as `who`. */
  async function inProcessStatus(
    entry: (typeof SERVICES)[number],
    method: DescMethod,
    who: ServiceIdentity,
  ): Promise<GrpcStatus> {
    const client = inProcessClient(
      { service: entry.service, handlers: emptyHandlers(entry.service), access: entry.access as never, log },
      who,
    ) as unknown as Record<string, (req: object) => Promise<unknown> | AsyncIterable<unknown>>;
    try {
      const call = client[method.localName]!({});
      if (method.methodKind === "server_streaming") {
        for await (const _ of call as AsyncIterable<unknown>) {
          /* drain */
        }
      } else await call;
      return GrpcStatus.OK;
    } catch (err) {
      if (err instanceof RemoteError) return err.status;
      throw err;
    }
  }

  it.each(cases())("$label: every identity it lists is served", async ({ entry, method, allowed }) => {
    expect(allowed.length).toBeGreaterThan(0);
    for (const who of allowed) expect(await inProcessStatus(entry, method, who), who).toBe(GrpcStatus.OK);
  });

  it.each(cases().filter((c) => c.other))(
    "$label: another service is denied",
    async ({ entry, method, other }) => {
      expect(await inProcessStatus(entry, method, other!)).toBe(GrpcStatus.PERMISSION_DENIED);
    },
  );
});

let pkiDir: string;
let pki: TestPki;
suite("mTLS", () => {
  pkiDir = mkdtempSync(join(tmpdir(), "tollgate-pki-"));
  pki = makeTestPki(pkiDir, [
    ...SERVICE_IDENTITIES.map((s) => ({
      name: s,
      uri: `spiffe://tollgate/${s}`,
      cn: "ignored-when-a-uri-names-one",
    })),
  ]);
  return { server: (s) => pki.as(s), as: (s) => pki.as(s), none: undefined };
});

describe("mTLS identities", () => {
  let server: GrpcServer;
  let dir: string;
  let p: TestPki;
  const createKey = (AuthService.methods as DescMethod[]).find((m) => m.localName === "createKey")!;
  const entry = SERVICES[0]!;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "tollgate-pki-"));
    p = makeTestPki(dir, [
      { name: "auth-policy", uri: "spiffe://tollgate/auth-policy" },
      { name: "edge-by-cn", cn: "api-edge" },
      { name: "nobody", cn: "mallory" },
      { name: "edge-elsewhere", uri: "spiffe://tollgate/api-edge", untrusted: true },
    ]);
    server = await serveGrpc({
      host: "127.0.0.1",
      port: 0,
      log,
      auth: p.as("auth-policy"),
      services: [implement(AuthService, emptyHandlers(AuthService as never), authAccess)],
    });
  });

  afterAll(async () => {
    await server?.stop(1_000);
    if (dir) rmSync(dir, { recursive: true, force: true });
    if (pkiDir) rmSync(pkiDir, { recursive: true, force: true });
  });

  it("takes the CN when no SPIFFE URI is there", async () => {
    expect(await statusOf(entry, `127.0.0.1:${server.port}`, createKey, p.as("edge-by-cn"))).toBe(
      GrpcStatus.OK,
    );
  });

  it("refuses a trusted certificate naming no service as unauthenticated", async () => {
    expect(await statusOf(entry, `127.0.0.1:${server.port}`, createKey, p.as("nobody"))).toBe(
      GrpcStatus.UNAUTHENTICATED,
    );
  });

  it("refuses a certificate from another CA, whatever it names", async () => {
    expect(await statusOf(entry, `127.0.0.1:${server.port}`, createKey, p.as("edge-elsewhere"))).not.toBe(
      GrpcStatus.OK,
    );
  });

  it("refuses a plaintext caller carrying a valid token-looking header", async () => {
    expect(
      await statusOf(entry, `127.0.0.1:${server.port}`, createKey, tokenAuth({ token: "anything" })),
    ).not.toBe(GrpcStatus.OK);
  });
});
