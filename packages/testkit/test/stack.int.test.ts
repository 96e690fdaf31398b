import { describe, expect, it } from "vitest";
import { useNats, useRedis } from "../src/fixtures.js";
import { startStack } from "../src/stack.js";

describe("startStack", () => {
  it("fails at once, naming the service, when a service exits before it listens", async () => {
    const [nats, redis] = await Promise.all([useNats(), useRedis()]);
    const started = Date.now();
    const failure = await startStack({
      natsUrl: nats.url,
      redisUrl: redis.url,
      // Every service reads this file at start and refuses it.
      transformConfig: () => "models: [unclosed\n",
    })
      .then(
        async (stack) => {
          await stack.stop();
          return undefined;
        },
        (err: Error) => err,
      )
      .finally(() => Promise.all([nats.stop(), redis.stop()]));
    expect(failure?.message).toMatch(
      /the stack did not start: [\w-]+ exited \(code [1-9]\d*\) before it listened/,
    );
    // Not the 30 s a port wait would have taken.
    expect(Date.now() - started).toBeLessThan(20_000);
  }, 60_000);
});
