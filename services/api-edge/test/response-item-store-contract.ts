// The behaviour every ResponseItemStore must show; run against memory (unit) and Redis (integration).
import { expect, it } from "vitest";
import type { ResponseItemStore } from "../src/domain/response-items.js";

/** A store whose items live `ttlMs`, fresh for each test, and a way to let time pass for it. */
export type ItemStoreFactory = (ttlMs: number) => {
  store: ResponseItemStore;
  /** Lets `ms` pass (a fake clock for memory, a real wait for Redis). */
  pass(ms: number): Promise<void>;
};

let n = 0;
const newId = () => `msg_contract_${Date.now()}_${n++}`;

export function responseItemStoreContract(make: ItemStoreFactory): void {
  it("gives back what was put, in the order asked, and undefined for an id never put", async () => {
    const { store } = make(60_000);
    const [a, b, never] = [newId(), newId(), newId()];
    await store.put(a, { account: "acct_1", role: "assistant", text: "first — ünïcode" });
    await store.put(b, { account: "acct_2", role: "assistant", text: "" });
    expect(await store.getMany([b, never, a])).toEqual([
      { account: "acct_2", role: "assistant", text: "" },
      undefined,
      { account: "acct_1", role: "assistant", text: "first — ünïcode" },
    ]);
    expect(await store.getMany([])).toEqual([]);
  });

  it("forgets an item once its time to live has passed", async () => {
    const { store, pass } = make(200);
    const id = newId();
    await store.put(id, { account: "acct_1", role: "assistant", text: "soon gone" });
    await pass(50);
    expect((await store.getMany([id]))[0]?.text).toBe("soon gone");
    await pass(300);
    expect(await store.getMany([id])).toEqual([undefined]);
  });
}
