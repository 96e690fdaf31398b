import { describe, expect, it } from "vitest";
import {
  clusterTag,
  connectRedis,
  isCluster,
  isRedisUnavailable,
  parseClusterUrl,
  pipelined,
  REDIS_CLUSTER_NODES,
  type Redis,
  redisAddress,
  redisUrlOf,
} from "./redis.js";

describe("isRedisUnavailable", () => {
  it("recognises the errors of an unreachable or restarting Redis", () => {
    for (const message of [
      "Stream isn't writeable and enableOfflineQueue options is false",
      "Connection is closed.",
      'Reached the max retries per request limit (which is 0). Refer to "maxRetriesPerRequest" option for details.',
      "LOADING Redis is loading the dataset in memory",
      "connect ECONNREFUSED 127.0.0.1:6379",
      "read ECONNRESET",
      "CLUSTERDOWN The cluster is down",
      "TRYAGAIN Multiple keys request during rehashing of slot",
      "Too many Cluster redirections. Last error: Error: Connection is closed.",
      "Cluster isn't ready and enableOfflineQueue options is false",
    ])
      expect(isRedisUnavailable(new Error(message)), message).toBe(true);
  });

  it("leaves command errors and non-errors alone", () => {
    expect(isRedisUnavailable(new Error("ERR wrong number of arguments for 'hget' command"))).toBe(false);
    expect(isRedisUnavailable(new Error("reservation budgets changed"))).toBe(false);
    expect(isRedisUnavailable("Connection is closed.")).toBe(false);
    expect(isRedisUnavailable(undefined)).toBe(false);
  });
});

describe("Redis Cluster URLs", () => {
  it("builds one from REDIS_CLUSTER_NODES, keeping REDIS_URL's credentials and TLS", () => {
    expect(redisUrlOf(undefined, "a:7000, b:7001")).toBe("redis+cluster://a:7000,b:7001");
    expect(redisUrlOf("redis://:p%40ss@redis:6379", "a:7000,b:7001")).toBe(
      "redis+cluster://:p%40ss@a:7000,b:7001",
    );
    expect(redisUrlOf("rediss://user:pw@redis:6380/0", "a:7000")).toBe("rediss+cluster://user:pw@a:7000");
    expect(redisUrlOf("redis+cluster://:pw@x:1,y:2", "a:7000")).toBe("redis+cluster://:pw@a:7000");
    expect(() => redisUrlOf(undefined, "a")).toThrow(/host:port/);
  });

  it("keeps a single-server URL, or none, as it is", () => {
    expect(redisUrlOf("redis://127.0.0.1:6379", undefined)).toBe("redis://127.0.0.1:6379");
    expect(redisUrlOf("redis://127.0.0.1:6379", " ")).toBe("redis://127.0.0.1:6379");
    expect(redisUrlOf(undefined, undefined)).toBeUndefined();
    expect(redisUrlOf("", "")).toBeUndefined();
  });

  it("parses a cluster URL into nodes and credentials; a single-server URL is not one", () => {
    expect(parseClusterUrl("redis+cluster://:p%40ss@a:7000,10.0.0.2:7001/")).toEqual({
      nodes: [
        { host: "a", port: 7000 },
        { host: "10.0.0.2", port: 7001 },
      ],
      password: "p@ss",
      tls: false,
    });
    expect(parseClusterUrl("rediss+cluster://u:pw@a:7000")).toEqual({
      nodes: [{ host: "a", port: 7000 }],
      username: "u",
      password: "pw",
      tls: true,
    });
    expect(parseClusterUrl("redis://a:6379")).toBeUndefined();
    expect(() => parseClusterUrl("redis+cluster://a:0")).toThrow(/host:port/);
  });

  it("matches the node lists the services' configuration accepts", () => {
    for (const ok of ["a:1", "a:1,b:2", " a:1 , b-2.svc:6379 "])
      expect(REDIS_CLUSTER_NODES.test(ok), ok).toBe(true);
    for (const bad of ["", "a", "a:1,", "redis://a:1", "a:b"])
      expect(REDIS_CLUSTER_NODES.test(bad), bad).toBe(false);
  });

  it("connects a cluster URL with ioredis's Cluster client, and tags keys only there", async () => {
    const cluster = connectRedis("redis+cluster://127.0.0.1:1", "t");
    const single = connectRedis("redis://127.0.0.1:1", "t");
    cluster.on("error", () => {});
    single.on("error", () => {});
    try {
      expect(isCluster(cluster)).toBe(true);
      expect(isCluster(single)).toBe(false);
      expect(clusterTag(cluster, "keys")).toBe("{keys}:");
      expect(clusterTag(single, "keys")).toBe("");
    } finally {
      cluster.disconnect();
      single.disconnect();
    }
  });
});

describe("pipelined", () => {
  it("answers each item with its own reply, in item order, and one no reply came for with an error", async () => {
    const sent: string[] = [];
    const fake = {
      pipeline: () => {
        const p = {
          get: (key: string) => {
            sent.push(key);
            return p;
          },
          // Redis answered the first two commands only.
          exec: async () => sent.slice(0, 2).map((key) => [null, `value of ${key}`]),
        };
        return p;
      },
    } as unknown as Redis;
    const replies = await pipelined(
      fake,
      ["a", "b", "c"],
      (key) => key,
      (p, key) => p.get(key),
    );
    expect(replies.slice(0, 2)).toEqual([
      [null, "value of a"],
      [null, "value of b"],
    ]);
    expect(replies[2]![0]).toBeInstanceOf(Error);
    expect((replies[2]![0] as Error).message).toBe("no reply");
    expect(replies[2]![1]).toBeNull();
  });
});

describe("redisAddress", () => {
  it("names the server or the cluster's nodes by host:port, without the URL's credentials", () => {
    expect(redisAddress("redis://default:s3cret@redis-0.redis:6380/0")).toBe("redis-0.redis:6380");
    expect(redisAddress("rediss://:s3cret@redis")).toBe("redis:6379");
    expect(redisAddress("redis+cluster://u:s3cret@a:7000,b:7001")).toBe("a:7000,b:7001");
  });
});
