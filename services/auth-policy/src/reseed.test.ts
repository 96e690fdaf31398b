import { EventEmitter } from "node:events";
import { parseGatewayConfig } from "@tollgate/config";
import { createLogger } from "@tollgate/kit/log";
import { captureLogs } from "@tollgate/testkit/logs";
import { describe, expect, it, vi } from "vitest";
import { createMemoryKeyStore } from "./adapters/memory-key-store.js";
import type { KeyStore } from "./domain/ports.js";
import { reseedWhenLost, seedCounts } from "./reseed.js";

const GATEWAY = parseGatewayConfig({
  upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:1/v1" }],
  models: [
    {
      id: "mini",
      upstream: "u",
      upstreamModel: "a",
      runtime: "vllm",
      pricing: { inputPerMillion: 1, outputPerMillion: 1 },
    },
  ],
  accounts: [
    {
      id: "demo",
      connections: [
        {
          id: "a",
          models: ["mini"],
          defaultModel: "mini",
          keys: [{ id: "k1", secret: "tg_dev_reseed_unit_key_one_0123456789" }],
        },
        { id: "b", models: ["mini"], defaultModel: "mini", keys: [] },
      ],
    },
  ],
});

function fixture(store: KeyStore = createMemoryKeyStore()) {
  const connection = new EventEmitter();
  const logs = captureLogs();
  const log = createLogger({ service: "auth-policy", level: "info", destination: logs.stream });
  let seeds = 0;
  const seed = async () => {
    seeds++;
    await store.setConfigKeyIds([]);
  };
  const stop = reseedWhenLost({ connection, store, gateway: GATEWAY, seed, log, retryMs: 10 });
  const settle = () => new Promise((r) => setTimeout(r, 30));
  return { connection, logs, stop, settle, seeds: () => seeds };
}

describe("reseedWhenLost", () => {
  it("counts what a seed loads", () => {
    expect(seedCounts(GATEWAY)).toEqual({ accounts: 1, connections: 2, keys: 1 });
  });

  it("re-seeds only a store whose seed marker is gone, logging it", async () => {
    const store = createMemoryKeyStore();
    await store.setConfigKeyIds([]);
    const f = fixture(store);
    f.connection.emit("ready");
    await f.settle();
    expect(f.seeds()).toBe(0);
    await f.stop();

    const empty = fixture();
    empty.connection.emit("ready");
    await vi.waitFor(() => expect(empty.seeds()).toBe(1), { timeout: 2_000 });
    await empty.settle();
    const records = empty.logs.records();
    expect(records.find((r) => r["level"] === "error")?.["msg"]).toMatch(/^store lost its data/);
    expect(records).toContainEqual(
      expect.objectContaining({
        level: "warn",
        msg: "store lost its data; configuration re-seeded",
        accounts: 1,
        connections: 2,
        keys: 1,
      }),
    );
    empty.connection.emit("ready");
    await empty.settle();
    expect(empty.seeds()).toBe(1);
    await empty.stop();
  });

  it("tries a failed check again, and stops on request", async () => {
    const inner = createMemoryKeyStore();
    let failures = 2;
    const store: KeyStore = {
      ...inner,
      seeded: async () => {
        if (failures-- > 0) throw new Error("Connection is closed.");
        return inner.seeded();
      },
    };
    const f = fixture(store);
    f.connection.emit("ready");
    await vi.waitFor(() => expect(f.seeds()).toBe(1), { timeout: 2_000 });
    await f.stop();
    await inner.setConfigKeyIds([]);
    f.connection.emit("ready");
    await f.settle();
    expect(f.seeds()).toBe(1);
  });
});
