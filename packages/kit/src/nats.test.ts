import { describe, expect, it } from "vitest";
import { natsOptions, natsServers, natsUrlOf } from "./nats.js";

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
