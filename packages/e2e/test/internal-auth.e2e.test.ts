import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createClient, GrpcStatus, RemoteError } from "@tollgate/kit/grpc";
import { AuthService } from "@tollgate/proto/auth";
import {
  type NatsFixture,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * The multi-process stack with internal authentication on (per-service tokens, as `make up`
 * runs it): the gateway works end to end, and a caller on the machine with no credential
 * cannot mint a key on auth-policy's port (docs/kubernetes.md, "Internal authentication").
 */
describe("internal authentication on the multi-process stack", () => {
  let nats: NatsFixture;
  let redis: RedisFixture;
  let stack: Stack;
  const namespace = uniqueNamespace("trust");
  const authPort = () => stack.processes.find((p) => p.name === "auth-policy")!.port;
  const admin = (path: string) =>
    fetch(`${stack.adminUrls[0]}${path}`, { headers: { authorization: `Bearer ${stack.adminToken}` } });
  const keyIds = async () => {
    const res = await admin("/admin/v1/accounts/demo/keys");
    expect(res.status).toBe(200);
    return ((await res.json()) as { data: Array<{ id: string }> }).data.map((k) => k.id).sort();
  };

  beforeAll(async () => {
    [nats, redis] = await Promise.all([useNats(), useRedis()]);
    stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1 });
  });

  afterAll(async () => {
    await stack?.stop();
    await nats?.stop();
    await redis?.stop();
  });

  it("serves a chat request and meters its usage", async () => {
    const res = await fetch(`${stack.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${stack.demoKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "tollgate-mini", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(res.status).toBe(200);
    let requests = 0;
    for (let i = 0; i < 50 && requests < 1; i++) {
      const usage = await admin("/admin/v1/usage?account=demo");
      expect(usage.status).toBe(200);
      requests = ((await usage.json()) as { totals: { requests: number } }).totals.requests;
      if (requests < 1) await new Promise((r) => setTimeout(r, 200));
    }
    expect(requests).toBe(1);
  });

  it("refuses CreateKey from a caller with no credential, and from a service not allowed, minting nothing", async () => {
    const before = await keyIds();
    expect(before.length).toBeGreaterThan(0);
    const request = { accountId: "demo", connectionId: "demo-default", name: "minted-by-an-attacker" };

    const anonymous = createClient(AuthService, `127.0.0.1:${authPort()}`);
    const asMetering = createClient(AuthService, `127.0.0.1:${authPort()}`, stack.internalAuth("metering"));
    try {
      const refused = await anonymous.createKey(request).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(refused).toBeInstanceOf(RemoteError);
      expect((refused as RemoteError).status).toBe(GrpcStatus.UNAUTHENTICATED);
      const listed = await anonymous.listKeys({ accountId: "demo" }).catch((e: unknown) => e);
      expect((listed as RemoteError).status).toBe(GrpcStatus.UNAUTHENTICATED);

      const denied = await asMetering.createKey(request).catch((e: unknown) => e);
      expect((denied as RemoteError).status).toBe(GrpcStatus.PERMISSION_DENIED);
      const settled = await anonymous
        .settleReservation({ reservationId: "r", actualCost: "0", eventId: "e" })
        .catch((e: unknown) => e);
      expect((settled as RemoteError).status).toBe(GrpcStatus.UNAUTHENTICATED);
    } finally {
      anonymous.$close();
      asMetering.$close();
    }
    expect(await keyIds()).toEqual(before);
  });

  it("logs the refusals without any token, key or credential", () => {
    const out = stack.output();
    expect(out).toContain("internal call refused");
    const tokenDir = readdirSync(join(stack.dir, "internal-auth"));
    const secrets = [
      stack.adminToken,
      stack.demoKey,
      ...tokenDir
        .filter((f) => f.endsWith(".token"))
        .map((f) => readFileSync(join(stack.dir, "internal-auth", f), "utf8").trim()),
    ];
    expect(secrets.length).toBeGreaterThan(5);
    for (const s of secrets) expect(out).not.toContain(s);
    expect(out.toLowerCase()).not.toContain("bearer ");
  });
});
