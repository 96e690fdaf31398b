import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { connectNats } from "@tollgate/kit/nats";
import { natsNames } from "@tollgate/proto/subjects";
import {
  type NatsFixture,
  privateNats,
  type RedisFixture,
  uniqueNamespace,
  useRedis,
} from "@tollgate/testkit/fixtures";
import { type Stack, startStack } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// NATS is a trust boundary (docs/kubernetes.md, "NATS and Redis are trust boundaries"): an
// operator runs it with users and passwords, and every service must then connect with the
// credentials its NATS_URL carries.
const namespace = uniqueNamespace("e2e-bus-auth");
const AUTH = { user: "tollgate-svc", pass: "p@ss:w0rd/with-specials" };
let nats: NatsFixture;
let redis: RedisFixture;
let stack: Stack;

beforeAll(async () => {
  nats = await privateNats(AUTH);
  redis = await useRedis();
  stack = await startStack({ natsUrl: nats.url, redisUrl: redis.url, namespace, routers: 1 });
}, 120_000);

afterAll(async () => {
  await stack?.stop();
  await nats?.stop();
  await redis?.stop();
});

describe("the stack on a NATS that requires a user and password", () => {
  it("serves a request, stores its usage event and metering consumes it; a client without the password is refused", async () => {
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
      let consumed = false;
      while (!consumed && Date.now() < deadline) {
        const stream = await jsm.streams.info(names.usageStream);
        const consumer = await jsm.consumers
          .info(names.usageStream, names.meteringDurable)
          .catch(() => undefined);
        consumed =
          stream.state.messages >= 1 &&
          consumer !== undefined &&
          consumer.ack_floor.stream_seq >= stream.state.last_seq;
        if (!consumed) await new Promise((r) => setTimeout(r, 200));
      }
      expect(consumed).toBe(true);
    } finally {
      await nc.close();
    }

    const bare = nats.url.replace(/\/\/[^@]*@/, "//");
    expect(bare).not.toContain(AUTH.user);
    await expect(connect({ servers: bare })).rejects.toThrow(/Authorization Violation/i);
  }, 60_000);
});
