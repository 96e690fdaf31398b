import { connectNats, drainNats } from "@tollgate/kit/nats";
import { connectRedis, isCluster, isRedisUnavailable, quitRedis, type Redis } from "@tollgate/kit/redis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type NatsClusterFixture,
  type RedisClusterFixture,
  startNatsCluster,
  startRedisCluster,
} from "../src/cluster.js";
import { keySlot } from "../src/slots.js";

/**
 * kit's connections on real clusters (docs/configuration.md, "Redis Cluster and NATS clusters"):
 * a Redis Cluster of three masters and three replicas, and three NATS nodes, private on loopback.
 */
describe("kit's Redis and NATS connections on a Redis Cluster and a NATS cluster", () => {
  let redisCluster: RedisClusterFixture;
  let natsCluster: NatsClusterFixture;
  let redis: Redis;

  beforeAll(async () => {
    [redisCluster, natsCluster] = await Promise.all([
      startRedisCluster({ nodeTimeoutMs: 1_000 }),
      startNatsCluster(),
    ]);
    redis = connectRedis(redisCluster.url, "cluster-int-test");
    redis.on("error", () => {});
  }, 40_000);

  afterAll(async () => {
    if (redis) await quitRedis(redis);
    await Promise.all([redisCluster?.stop(), natsCluster?.stop()]);
  }, 20_000);

  it("runs scripts and pipelines within one slot, and refuses keys across slots (CROSSSLOT)", async () => {
    expect(isCluster(redis)).toBe(true);
    const client = redis as Redis & { clusterPair(...args: string[]): Promise<number> };
    client.defineCommand("clusterPair", {
      numberOfKeys: 2,
      lua: "redis.call('SET', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[1]) return 1",
    });
    expect(await client.clusterPair("t:{acct-1}:a", "t:{acct-1}:b", "x")).toBe(1);
    expect(await redis.mget("t:{acct-1}:a", "t:{acct-1}:b")).toEqual(["x", "x"]);
    const res = await redis.pipeline().get("t:{acct-1}:a").incr("t:{acct-1}:n").exec();
    expect(res?.map(([err]) => err)).toEqual([null, null]);
    // The slot the unit tests compute is the one the cluster uses.
    for (const key of ["t:{acct-1}:a", "tollgate:auth:{keys}:deadlines", "plain-key", "a{}b{c}"])
      expect(await redis.call("CLUSTER", "KEYSLOT", key), key).toBe(keySlot(key));
    const [a, b] = ["t:{x}:a", "t:{y}:a"];
    expect(keySlot(a)).not.toBe(keySlot(b));
    const err = await client.clusterPair(a, b, "x").catch((e: Error) => e);
    expect(String(err)).toMatch(/CROSSSLOT/);
    expect(isRedisUnavailable(err)).toBe(false);
  });

  it("fails over a master: commands to its slots fail fast as unavailable meanwhile, none is applied twice", async () => {
    const key = "t:{failover}:n";
    const victim = await redisCluster.masterOf(key);
    let issued = 0;
    let ok = 0;
    const errors: unknown[] = [];
    let stop = false;
    const loop = (async () => {
      while (!stop) {
        issued++;
        const started = performance.now();
        try {
          await redis.incr(key);
          ok++;
        } catch (e) {
          errors.push(e);
          expect(performance.now() - started).toBeLessThan(2_000);
          await new Promise((r) => setTimeout(r, 20));
        }
      }
    })();
    await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    await redisCluster.kill(victim);
    const failoverMs = await redisCluster.waitForFailover(victim, t0);
    await new Promise((r) => setTimeout(r, 1_000));
    stop = true;
    await loop;
    const value = Number(await redis.get(key));
    console.log(
      `redis failover ${failoverMs} ms: ${issued} INCR, ${ok} ok, ${errors.length} refused, value ${value}`,
    );
    expect(errors.length).toBeGreaterThan(0);
    for (const e of errors) expect(isRedisUnavailable(e), String(e)).toBe(true);
    // None counted twice (an INCR lost with its reply may count once). Redis replicates
    // asynchronously, so INCRs the dying master acknowledged but had not yet sent to its replica
    // are lost with it: seen in CI (2,709 of 23,466 on a busy machine); docs/runbooks/README.md.
    console.log(`acknowledged but lost in the failover: ${Math.max(0, ok - value)}`);
    expect(value).toBeLessThanOrEqual(issued);
    expect(await redisCluster.masterOf(key)).not.toBe(victim);
  }, 30_000);

  it("connects NATS to a server list and rides out the loss of the server it is on", async () => {
    const nc = await connectNats(natsCluster.url.split(",").join(", "), "cluster-int-test");
    try {
      const sub = nc.subscribe("cluster.int.test");
      const got: string[] = [];
      void (async () => {
        for await (const m of sub) got.push(m.string());
      })();
      nc.publish("cluster.int.test", "before");
      await nc.flush();
      const on = Number(new URL(`nats://${nc.getServer()}`).port);
      await natsCluster.kill(on);
      const deadline = Date.now() + 10_000;
      while (Date.now() < deadline) {
        try {
          nc.publish("cluster.int.test", "after");
          await nc.flush();
          if (got.includes("after")) break;
        } catch {
          // reconnecting
        }
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(got).toContain("before");
      expect(got).toContain("after");
      expect(Number(new URL(`nats://${nc.getServer()}`).port)).not.toBe(on);
      await natsCluster.restart(on);
    } finally {
      await drainNats(nc);
    }
  }, 20_000);
});
