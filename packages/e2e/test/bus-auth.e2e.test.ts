import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { connectNats } from "@tollgate/kit/nats";
import { natsNames } from "@tollgate/proto/subjects";
import {
  type NatsAuth,
  type NatsFixture,
  privateNats,
  type RedisFixture,
  uniqueNamespace,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";

// NATS is a trust boundary (docs/kubernetes.md, "NATS and Redis are trust boundaries"): an
// operator runs it with users and passwords, and every service must then connect with the
// credentials its NATS_URL carries, within the subjects that section lists.
const USER = "tollgate-svc";
const PASS = "p@ss:w0rd/with-specials";
let redis: RedisFixture;
let nats: NatsFixture | undefined;
let stack: Stack | undefined;

beforeAll(async () => {
  redis = await useRedis();
});

afterEach(async () => {
  await stack?.stop();
  await nats?.stop();
  stack = undefined;
  nats = undefined;
});

afterAll(async () => {
  await redis?.stop();
});

/**
 * Starts the stack on a private NATS with `auth`, serves one chat, and resolves once metering
 * has acknowledged its usage event (false if it had not within 15 s).
 */
async function serveAndMeter(namespace: string, auth: NatsAuth): Promise<boolean> {
  nats = await privateNats(auth);
  stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1 });
  const res = await fetch(`${stack.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${stack.demoKey}`, "content-type": "application/json" },
    body: JSON.stringify({ max_tokens: 8, messages: [{ role: "user", content: "hello" }] }),
  });
  // The router answers only once its usage event is stored: a 200 is a publish NATS accepted.
  expect(res.status, await res.clone().text()).toBe(200);
  await res.text();
  const names = natsNames(namespace);
  const nc = await connectNats(nats.url, "e2e");
  try {
    const jsm = await jetstreamManager(nc);
    const deadline = Date.now() + 15_000;
    for (;;) {
      const stream = await jsm.streams.info(names.usageStream);
      const consumer = await jsm.consumers
        .info(names.usageStream, names.meteringDurable)
        .catch(() => undefined);
      if (stream.state.messages >= 1 && consumer && consumer.ack_floor.stream_seq >= stream.state.last_seq)
        return true;
      if (Date.now() > deadline) return false;
      await new Promise((r) => setTimeout(r, 200));
    }
  } finally {
    await nc.close();
  }
}

describe("the stack on a NATS that requires a user and password", () => {
  it("serves a request, stores its usage event and metering acknowledges it; a client without the password is refused", async () => {
    expect(await serveAndMeter(uniqueNamespace("e2e-bus-auth"), { user: USER, pass: PASS })).toBe(true);
    const bare = nats!.url.replace(/\/\/[^@]*@/, "//");
    expect(bare).not.toContain(USER);
    await expect(connect({ servers: bare })).rejects.toThrow(/Authorization Violation/i);
  }, 60_000);

  it("works within exactly the subjects docs/kubernetes.md lists for the gateway's user", async () => {
    const namespace = uniqueNamespace("e2e-bus-perm");
    // `tollgate.>` under the installation's namespace, the JetStream API and acknowledgements,
    // and replies.
    const own = natsNames(namespace).usageSubjects.replace(/usage\.v1\.>$/, ">");
    const subjects = [own, "$JS.API.>", "$JS.ACK.>", "_INBOX.>"];
    const acknowledged = await serveAndMeter(namespace, {
      user: USER,
      pass: PASS,
      permissions: { publish: subjects, subscribe: subjects },
    });
    expect(acknowledged, "metering could not acknowledge its events within these permissions").toBe(true);
  }, 60_000);
});
