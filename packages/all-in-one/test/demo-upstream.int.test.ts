import type { FakeUpstream, RecordedRequest } from "@tollgate/demo/fake-upstream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type AllInOne, startAllInOne } from "../src/app.js";
import { loadConfig } from "../src/config.js";

/** What a fake upstream kept of the requests it answered: nothing when it does not record. */
function kept(upstream: FakeUpstream): RecordedRequest[] {
  try {
    return upstream.requests;
  } catch {
    return [];
  }
}

describe("all-in-one demo: the bundled fake upstream", () => {
  let aio: AllInOne;

  beforeAll(async () => {
    // The demo as `npm start` runs it (no Redis, NATS or configuration file), on free ports.
    const { metricsPort: _metrics, ...cfg } = loadConfig({
      PORT: "0",
      TEMPO_DEVNET_PORT: "0",
      LOG_LEVEL: "silent",
    });
    aio = await startAllInOne(cfg);
  });

  afterAll(async () => {
    await aio?.stop();
  });

  it("keeps no request body (nor header) after answering, however large the bodies were", async () => {
    // Just under the 4 MiB body limit, as in the bursts that held the demo's heap at 513 MB.
    const content = "x".repeat(3_900_000);
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${aio.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${aio.demoKey}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "tollgate-mini",
          max_tokens: 2,
          messages: [{ role: "user", content }],
        }),
        signal: AbortSignal.timeout(20_000),
      });
      expect(res.status).toBe(200);
      // The upstream answered it: the prompt was counted there.
      const body = (await res.json()) as { usage: { prompt_tokens: number } };
      expect(body.usage.prompt_tokens).toBeGreaterThan(900_000);
    }
    expect(aio.upstream).toBeDefined();
    // Compared as path and body size, so a failure does not print megabytes of prompt.
    const summary = kept(aio.upstream!).map(
      (r) => `${r.path}: ${JSON.stringify(r.body ?? null).length} bytes`,
    );
    expect(summary).toEqual([]);
  });
});
