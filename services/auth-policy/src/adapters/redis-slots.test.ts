import { randomBytes, randomInt } from "node:crypto";
import { crossSlot, keySlot, slotRecorder } from "@tollgate/testkit/slots";
import { describe, expect, it } from "vitest";
import { budgetChecks, newReservationId } from "../domain/budget.js";
import type { ConnectionPolicy, KeyRecord } from "../domain/ports.js";
import { windowsFor } from "../domain/rate-limit.js";
import { createRedisKeyStore } from "./redis-key-store.js";
import { createRedisLedger } from "./redis-ledger.js";

// Account, connection and key ids as the configuration and the admin API allow them.
const ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-";
const randomId = () =>
  `${"abc0"[randomInt(4)]}${Array.from({ length: randomInt(0, 40) }, () => ID_CHARS[randomInt(ID_CHARS.length)]).join("")}`;

const ROUNDS = 200;

describe("auth-policy's Redis keys on a Redis Cluster: every script, pipeline and MULTI stays in one slot", () => {
  it("the ledger: admission (windows, budgets, the reservation) and settlement of random accounts", async () => {
    for (let i = 0; i < ROUNDS; i++) {
      const accountId = randomId();
      const connectionId = randomId();
      const keyId = `key_${randomBytes(8).toString("hex")}`;
      const now = new Date(Date.now() + randomInt(0, 400) * 86_400_000);
      const limits = { requestsPerMinute: 60, tokensPerMinute: 1_000 };
      const connection = {
        accountId,
        connectionId,
        limits: { connection: limits, perKey: limits, routes: { chat: limits } },
      } as unknown as ConnectionPolicy;
      const windows = windowsFor({
        account: { accountId, limits, createdAt: now },
        connection,
        keyLineageId: keyId,
        route: "chat",
        tokens: 10,
      });
      const budgets = budgetChecks({
        accountId,
        connectionId,
        keyLineageId: keyId,
        connectionBudget: { amount: 1_000n, period: "month" },
        keyBudget: { amount: 100n, period: { days: 3 } },
        now,
      });
      const { redis, calls } = slotRecorder((name) =>
        name === "hget"
          ? budgets.map((b) => b.id).join(" ")
          : name === "authSettle"
            ? [["settled", "5"]]
            : [],
      );
      const ledger = createRedisLedger(redis, { prefix: `tollgate:${randomId()}:` });
      const reservationId = newReservationId(accountId);
      await ledger.admit(windows, { hold: { reservationId, amount: 5n, budgets } }, now);
      await ledger.admit(windows, { peek: budgets }, now);
      await ledger.consume(windows, now);
      await ledger.settle(reservationId, 5n, "evt", now);
      const scripts = calls.filter((c) => c.kind === "script");
      expect(scripts.map((c) => c.name)).toEqual(["authAdmit", "authAdmit", "authAdmit", "authSettle"]);
      // Every window, both budgets and holds and the reservation record.
      expect(scripts[0]!.keys).toHaveLength(windows.length + 2 * budgets.length + 1);
      expect(scripts[3]!.keys).toHaveLength(1 + 2 * budgets.length);
      expect(crossSlot(calls)).toEqual([]);
    }
  });

  it("the ledger: a batch settlement of reservations of several accounts, one pipeline per account", async () => {
    for (let i = 0; i < ROUNDS / 10; i++) {
      const now = new Date();
      const held = Array.from({ length: randomInt(2, 12) }, () => {
        const accountId = randomId();
        const budgets = budgetChecks({
          accountId,
          connectionId: randomId(),
          keyLineageId: `key_${randomBytes(8).toString("hex")}`,
          connectionBudget: { amount: 1_000n, period: "month" },
          now,
        });
        return { reservationId: newReservationId(accountId), budgets: budgets.map((b) => b.id).join(" ") };
      });
      const { redis, calls } = slotRecorder((name, args) =>
        name === "hget"
          ? held.find((h) => String(args[0]).includes(h.reservationId))?.budgets
          : name === "authSettle"
            ? [["settled", "5"]]
            : [],
      );
      const ledger = createRedisLedger(redis, { prefix: `tollgate:${randomId()}:` });
      const settled = await ledger.settleMany!(
        held.map((h, n) => ({ reservationId: h.reservationId, cost: 5n, eventId: `evt${n}` })),
        now,
      );
      expect(settled).toEqual(held.map(() => ({ outcome: "settled", cost: 5n })));
      expect(calls.filter((c) => c.kind === "pipeline").length).toBeGreaterThanOrEqual(2);
      expect(crossSlot(calls)).toEqual([]);
    }
  });

  it("the key store: create, import, rotate, list, policy, deadlines and configured keys", async () => {
    for (let i = 0; i < ROUNDS; i++) {
      const accountId = randomId();
      const connectionId = randomId();
      const hashHex = randomBytes(32).toString("hex");
      const { redis, calls } = slotRecorder((name, args) => {
        const byId = String(args[0]).includes(":key-id:");
        if (name === "get") return byId ? hashHex : null;
        if (name === "mget") return byId ? [hashHex, hashHex] : [null, null];
        if (name === "smembers") return [connectionId];
        if (name === "zrange") return ["key_a", "key_b"];
        if (name === "hgetall") return {};
        if (name === "authRotateKey" || name === "authCreateKey") return 1;
        if (name === "authTakeDue") return [];
        return "OK";
      });
      const store = createRedisKeyStore(redis, { prefix: `tollgate:${randomId()}:` });
      const key = (id: string): KeyRecord => ({
        keyId: id,
        hash: randomBytes(32),
        accountId,
        connectionId,
        name: "k",
        last4: "abcd",
        createdAt: new Date(),
        expiresAt: new Date(Date.now() + 60_000),
      });
      await store.createKey(key("key_1"));
      await store.importKey(key("key_2"), false);
      await store.rotateKey("key_1", key("key_3"), new Date(Date.now() + 1_000), new Date());
      await store.takeDueDeadlines(new Date(), 10);
      await store.listKeys(accountId);
      await store.policy(accountId, connectionId);
      await store.putConnection({
        accountId,
        connectionId,
        createdAt: new Date(),
      } as unknown as ConnectionPolicy);
      await store.setConfigKeyIds(["key_1", "key_2"]);
      expect(calls.filter((c) => c.kind === "script").map((c) => c.name)).toEqual([
        "authCreateKey",
        "authImportKey",
        "authRotateKey",
        "authTakeDue",
      ]);
      expect(calls.filter((c) => c.kind === "pipeline" || c.kind === "multi")).toHaveLength(3);
      expect(crossSlot(calls)).toEqual([]);
    }
  });

  it("computes the slots Redis does (CLUSTER KEYSLOT)", () => {
    // Values from Redis's own cluster specification and CLUSTER KEYSLOT.
    expect(keySlot("123456789")).toBe(12739);
    expect(keySlot("foo")).toBe(12182);
    expect(keySlot("{user1000}.following")).toBe(keySlot("{user1000}.followers"));
    expect(keySlot("foo{}{bar}")).toBe(keySlot("foo{}{bar}"));
    expect(keySlot("foo{}{bar}")).not.toBe(keySlot("bar"));
    expect(keySlot("foo{{bar}}zap")).toBe(keySlot("{bar"));
  });
});
