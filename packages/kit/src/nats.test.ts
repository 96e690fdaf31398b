import { describe, expect, it } from "vitest";
import { natsAddress, natsCredentials, natsOptions, natsServers, natsUrlOf } from "./nats.js";

describe("natsOptions", () => {
  it("turns off the async stack trace nats.js would capture on every request and publish", () => {
    expect(natsOptions("nats://127.0.0.1:4222", "svc").noAsyncTraces).toBe(true);
  });

  it("lists every server of a comma-separated URL and reconnects forever", () => {
    const opts = natsOptions("nats://a:4222,nats://b:4222", "svc");
    expect(opts.servers).toEqual(["nats://a:4222", "nats://b:4222"]);
    expect(opts.name).toBe("svc");
    expect(opts.maxReconnectAttempts).toBe(-1);
  });
});

describe("NATS credentials in the URL", () => {
  it("passes a user and password, or a token, as options and keeps them out of the server list", () => {
    const opts = natsOptions("nats://svc-router:p%40ss%3Aw0rd@nats-0:4222,nats://nats-1:4222", "svc");
    expect(opts.servers).toEqual(["nats://nats-0:4222", "nats://nats-1:4222"]);
    expect(opts).toMatchObject({ user: "svc-router", pass: "p@ss:w0rd" });
    expect(natsOptions("nats://s3cr3t-token@nats:4222", "svc")).toMatchObject({
      servers: ["nats://nats:4222"],
      token: "s3cr3t-token",
    });
    expect(natsOptions("u:p@127.0.0.1:4222", "svc")).toMatchObject({
      servers: ["127.0.0.1:4222"],
      user: "u",
      pass: "p",
    });
  });

  it("sets none when the URL carries none", () => {
    const opts = natsOptions("nats://a:4222", "svc");
    expect(natsCredentials(["nats://a:4222", "b:4222"])).toBeUndefined();
    expect(opts).not.toHaveProperty("user");
    expect(opts).not.toHaveProperty("token");
  });
});

describe("NATS server lists", () => {
  it("splits a comma-separated list, dropping blanks", () => {
    expect(natsServers("nats://a:4222, nats://b:4222,,nats://c:4222 ")).toEqual([
      "nats://a:4222",
      "nats://b:4222",
      "nats://c:4222",
    ]);
    expect(natsServers("nats://a:4222")).toEqual(["nats://a:4222"]);
  });

  it("takes NATS_SERVERS over NATS_URL, and either alone", () => {
    expect(natsUrlOf("nats://one:4222", "nats://a:4222,nats://b:4222")).toBe("nats://a:4222,nats://b:4222");
    expect(natsUrlOf("nats://a:4222, nats://b:4222", undefined)).toBe("nats://a:4222,nats://b:4222");
    expect(natsUrlOf(undefined, "nats://a:4222")).toBe("nats://a:4222");
    expect(natsUrlOf("", "")).toBeUndefined();
    expect(natsUrlOf(undefined, undefined)).toBeUndefined();
  });
});

describe("natsAddress", () => {
  it("names each server by host:port, without the credentials a URL may carry", () => {
    expect(natsAddress("nats://svc:s3cret@nats-0:4222,nats://tok3n@nats-1:4222,nats-2:4222")).toBe(
      "nats-0:4222,nats-1:4222,nats-2:4222",
    );
  });
});
