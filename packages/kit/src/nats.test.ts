import { describe, expect, it } from "vitest";
import { natsOptions } from "./nats.js";

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
