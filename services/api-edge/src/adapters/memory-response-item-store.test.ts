import { describe, expect, it } from "vitest";
import { responseItemStoreContract } from "../../test/response-item-store-contract.js";
import { createMemoryResponseItemStore } from "./memory-response-item-store.js";

describe("memory response item store", () => {
  responseItemStoreContract((ttlMs) => {
    let now = 1_000_000;
    return {
      store: createMemoryResponseItemStore(ttlMs, { items: 1_000, bytes: 1_000_000 }, () => now),
      pass: async (ms) => {
        now += ms;
      },
    };
  });

  it("keeps at most its bound of items, dropping the oldest first", async () => {
    const store = createMemoryResponseItemStore(60_000, { items: 3, bytes: 1_000 });
    for (const id of ["a", "b", "c", "d"]) await store.put(id, { account: "x", role: "assistant", text: id });
    expect(store.retained()).toEqual({ items: 3, bytes: 3 });
    expect((await store.getMany(["a", "b", "d"])).map((i) => i?.text)).toEqual([undefined, "b", "d"]);
  });

  it("keeps at most its bound of text bytes, dropping the oldest first", async () => {
    const store = createMemoryResponseItemStore(60_000, { items: 100, bytes: 10 });
    for (const id of ["a", "b", "c"]) {
      await store.put(id, { account: "x", role: "assistant", text: id.repeat(4) });
    }
    expect(store.retained()).toEqual({ items: 2, bytes: 8 });
    expect((await store.getMany(["a", "b", "c"])).map((i) => i?.text)).toEqual([undefined, "bbbb", "cccc"]);
  });

  it("drops expired items even when they are never asked for again", async () => {
    let now = 0;
    const store = createMemoryResponseItemStore(1_000, { items: 100, bytes: 1_000 }, () => now);
    for (let i = 0; i < 50; i++) await store.put(`old${i}`, { account: "x", role: "assistant", text: "t" });
    now = 2_000;
    await store.put("new", { account: "x", role: "assistant", text: "t" });
    expect(store.retained()).toEqual({ items: 1, bytes: 1 });
  });
});
