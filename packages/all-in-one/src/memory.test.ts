import { createMemoryBus } from "@tollgate/kit/bus";
import { GrpcStatus, type Handlers } from "@tollgate/kit/grpc";
import { inProcessClient } from "@tollgate/kit/in-process";
import { createLogger } from "@tollgate/kit/log";
import { InferenceService } from "@tollgate/proto/inference";
import { heapBytesPerItem } from "@tollgate/testkit/heap";
import { describe, expect, it } from "vitest";

// The all-in-one's usage bus under sustained load: every msgId of the duplicate window (two
// minutes, as JetStream's) stays remembered, about 200 000 of them at the bench's rate.
describe("the all-in-one's memory bus", () => {
  it("holds a msgId of its duplicate window in under 80 bytes besides the id itself", async () => {
    const bus = createMemoryBus();
    const ids = Array.from({ length: 100_000 }, (_, i) => `evt_${i}`);
    const data = new TextEncoder().encode("{}");
    let handled = 0;
    const sub = await bus.subscribeBatch("metering", "usage.>", async (batch) => {
      handled += batch.length;
      return batch.map(() => "ack" as const);
    });
    const perId = await heapBytesPerItem(ids.length, async () => {
      for (const id of ids) await bus.publish("usage.recorded", data, id);
      while (handled < ids.length) await new Promise((r) => setTimeout(r, 5));
    });
    // Every message handled and dropped; every msgId still deduplicates.
    expect(bus.retained()).toEqual({ messages: 0, msgIds: ids.length });
    await bus.publish("usage.recorded", data, ids[0]!);
    expect(await sub.pending()).toBe(0);
    expect(perId).toBeLessThan(80);
    await sub.stop();
    await bus.close();
  });
});

// The all-in-one's api-edge reads the router's streams in process, one message per chunk.
describe("the all-in-one's in-process streams", () => {
  it("keep nothing of the messages already delivered while the stream runs", async () => {
    const value = new TextEncoder().encode("a token");
    // A stream as long as its caller reads, like a model's long answer.
    const handlers = {
      async complete() {
        return { body: value };
      },
      async *streamComplete() {
        for (;;) yield { event: { case: "chunk" as const, value } };
      },
    } as unknown as Handlers<typeof InferenceService>;
    const client = inProcessClient(
      {
        service: InferenceService,
        handlers,
        access: { complete: ["api-edge"], streamComplete: ["api-edge"] },
        log: createLogger({ service: "test", level: "silent" }),
      },
      "api-edge",
    );
    // With a signal, as api-edge calls it: the caller going away cancels the stream.
    const caller = new AbortController();
    const stream = client
      .streamComplete({ input: { requestId: "req_1" } }, { signal: caller.signal })
      [Symbol.asyncIterator]();
    await stream.next();
    const messages = 50_000;
    const perMessage = await heapBytesPerItem(messages, async () => {
      for (let i = 0; i < messages; i++) await stream.next();
    });
    expect(perMessage).toBeLessThan(16);
    caller.abort();
    await expect(stream.next()).rejects.toMatchObject({ status: GrpcStatus.CANCELLED });
  });
});
