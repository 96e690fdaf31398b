import { readFileSync } from "node:fs";
import { connect as connectTcp } from "node:net";
import { fileURLToPath } from "node:url";
import { jetstreamManager, StorageType } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { childScript, outputOf } from "@tollgate/kit/child-script";
import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import {
  freePort,
  type NatsFixture,
  privateNats,
  privateRedis,
  type RedisFixture,
  uniqueNamespace,
  useNats,
  useRedis,
} from "../src/fixtures.js";

const fixtures: (NatsFixture | RedisFixture)[] = [];
afterAll(async () => {
  await Promise.all(fixtures.map((f) => f.stop()));
});

async function track<F extends NatsFixture | RedisFixture>(f: Promise<F>): Promise<F> {
  const fixture = await f;
  fixtures.push(fixture);
  return fixture;
}

function redisClient(url: string): Redis {
  return new Redis(url, { maxRetriesPerRequest: 1, connectTimeout: 2_000, lazyConnect: true });
}

/** True when something accepts TCP connections on the port. */
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connectTcp(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

describe("fixtures", () => {
  it("useNats gives a server with JetStream enabled", async () => {
    const nats = await track(useNats());
    expect(nats.url).toMatch(/^nats:\/\//);
    const nc = await connect({ servers: nats.url, timeout: 5_000 });
    try {
      const info = await (await jetstreamManager(nc)).getAccountInfo();
      expect(info.limits).toBeDefined();
    } finally {
      await nc.close();
    }
  });

  it("privateNats keeps file-stored streams across restart() and frees its port on stop()", async () => {
    const nats = await privateNats();
    const port = Number(new URL(nats.url).port);
    const ns = uniqueNamespace();
    const open = () => connect({ servers: nats.url, timeout: 5_000 });
    let nc = await open();
    try {
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({ name: ns, subjects: [`${ns}.>`], storage: StorageType.File });
      await jsm.jetstream().publish(`${ns}.a`, "one");
      await nc.close();

      await nats.restart();
      expect(nats.url).toBe(`nats://127.0.0.1:${port}`);
      nc = await open();
      const info = await (await jetstreamManager(nc)).streams.info(ns);
      expect(info.state.messages).toBe(1);
    } finally {
      await nc.close();
      await nats.stop();
    }
    expect(await accepts(port)).toBe(false);
  });

  it("useRedis answers PING", async () => {
    const redis = await track(useRedis());
    expect(redis.url).toMatch(/^redis:\/\//);
    const client = redisClient(redis.url);
    try {
      expect(await client.ping()).toBe("PONG");
    } finally {
      client.disconnect();
    }
  });

  it("privateRedis with appendOnly keeps data across restart(); without it, loses it", async () => {
    const key = `${uniqueNamespace()}:balance`;
    for (const appendOnly of [true, false]) {
      const redis = await track(privateRedis({ appendOnly }));
      let client = redisClient(redis.url);
      await client.set(key, "42");
      client.disconnect();

      await redis.restart();
      client = redisClient(redis.url);
      try {
        expect(await client.get(key)).toBe(appendOnly ? "42" : null);
      } finally {
        client.disconnect();
      }
    }
  });

  it("kills its private servers when its process is ended by SIGTERM, as vitest ends a worker", async () => {
    const fixturesModule = fileURLToPath(new URL("../src/fixtures.ts", import.meta.url));
    const child = childScript(
      `import { privateRedis } from ${JSON.stringify(fixturesModule)}; const r = await privateRedis(); console.log(r.url); setInterval(() => {}, 1000);`,
    );
    const ended = outputOf(child);
    const url = await new Promise<string>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (d: Buffer) => {
        out += d.toString("utf8");
        const m = /redis:\/\/\S+/.exec(out);
        if (m) resolve(m[0]);
      });
      child.once("close", () => reject(new Error(`the child ended first: ${out}`)));
    });
    const port = Number(new URL(url).port);
    expect(await accepts(port)).toBe(true);
    child.kill("SIGTERM");
    expect((await ended).code).toBeNull();
    expect(child.signalCode).toBe("SIGTERM");
    try {
      const deadline = Date.now() + 3_000;
      while ((await accepts(port)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(await accepts(port)).toBe(false);
    } finally {
      // On failure, the server the child left: shut it down.
      if (await accepts(port)) {
        const leftover = redisClient(url);
        await leftover.call("SHUTDOWN", "NOSAVE").catch(() => undefined);
        leftover.disconnect();
      }
    }
  }, 20_000);

  it("uniqueNamespace never repeats", () => {
    const names = Array.from({ length: 1_000 }, () => uniqueNamespace("usage"));
    expect(new Set(names).size).toBe(names.length);
    expect(names[0]).toMatch(/^usage_[0-9a-f]{8}$/);
    expect(uniqueNamespace()).toMatch(/^t_[0-9a-f]{8}$/);
  });

  it("freePort returns a port nobody listens on", async () => {
    const port = await freePort();
    expect(port).toBeGreaterThan(0);
    expect(await accepts(port)).toBe(false);
  });

  it("freePort hands out distinct ports below the ephemeral range, where no client socket can sit on one before its server binds it", async () => {
    const ephemeralLow = Number(
      readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").split(/\s+/)[0],
    );
    const ports: number[] = [];
    for (let i = 0; i < 200; i++) ports.push(await freePort());
    expect(new Set(ports).size).toBe(ports.length);
    expect(ports.filter((p) => p >= ephemeralLow)).toEqual([]);
  });
});
