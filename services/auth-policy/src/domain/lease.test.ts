import { parseGatewayConfig } from "@tollgate/config";
import { beforeEach, describe, expect, it } from "vitest";
import { createMemoryKeyStore } from "../adapters/memory-key-store.js";
import { createMemoryLedger } from "../adapters/memory-ledger.js";
import { type AuthorizeDeps, type AuthorizeInput, authorize } from "./authorize.js";
import { AuthError } from "./errors.js";
import { importConfig } from "./import-config.js";
import { acquireLease, leaseSize, returnLease } from "./lease.js";
import type { OverHold, RateWindow } from "./ports.js";
import type { BudgetCheck } from "./types.js";

// 1 base unit per input and per output token: a quote is bodyBytes + 8 × messages + 16 + cap.
const pricing = { inputPerMillion: 1_000_000, outputPerMillion: 1_000_000 };
const KEY = "tg_test_lease_key_one_0000000";
const LIMITED = "tg_test_lease_key_two_0000000";
const FREE = "tg_test_lease_key_three_00000";
const CONFIG = parseGatewayConfig({
  upstreams: [{ id: "u", baseUrl: "http://127.0.0.1:1/v1" }],
  models: [{ id: "m", upstream: "u", upstreamModel: "m", runtime: "vllm", pricing }],
  accounts: [
    {
      id: "acme",
      connections: [
        {
          id: "capped",
          models: ["m"],
          defaultModel: "m",
          budget: { amount: 10_000 },
          keys: [{ id: "k1", secret: KEY }],
        },
        {
          id: "limited",
          models: ["m"],
          defaultModel: "m",
          policy: { defaultMaxOutputTokens: 100, maxOutputTokens: 1000 },
          limits: { keyRequestsPerMinute: 10 },
          keys: [{ id: "k2", secret: LIMITED }],
        },
        { id: "free", models: ["m"], defaultModel: "m", keys: [{ id: "k3", secret: FREE }] },
      ],
    },
  ],
});

const NOW = new Date("2025-06-10T12:00:00Z");
let deps: AuthorizeDeps;
beforeEach(async () => {
  deps = {
    store: createMemoryKeyStore(),
    ledger: createMemoryLedger(),
    prices: new Map(CONFIG.models.map((m) => [m.id, m.pricing])),
  };
  await importConfig(deps.store, CONFIG, new Date(NOW.getTime() - 86_400_000));
});

/** A request quoted at exactly 250 base units: 84 bytes, 2 messages, cap 134. */
const request = (key: string, input: Partial<AuthorizeInput> = {}): AuthorizeInput => ({
  key,
  model: "",
  route: "chat",
  bodyBytes: 84,
  messageCount: 2,
  maxOutputTokens: 134,
  ...input,
});
let peeks = 0;
/** The connection's budget left: a request's hold taken and given back at once. */
const budgetLeft = async () => {
  const a = await authorize(deps, request(KEY), NOW);
  await deps.ledger.settle(a.reservationId!, 0n, `peek_${++peeks}`, NOW);
  return a.budgetRemaining! + a.quote!;
};

describe("leaseSize", () => {
  const check: BudgetCheck = {
    id: "{a}:connection:c:month:2025-06",
    scope: "connection",
    limit: 1_000n,
    periodEndMs: 0,
  };
  const window: RateWindow = { id: "{a}:key:k:requests", scope: "key", unit: "requests", limit: 10, cost: 1 };

  it("grants what is wanted, but never more than half of what is left of a budget or a window", () => {
    const none = { spent: 0n, held: 0n };
    expect(leaseSize({ budgets: [{ check, count: none }], windows: [], quote: 100n, wanted: 4 })).toEqual({
      budget: 400n,
    });
    expect(
      leaseSize({
        budgets: [{ check, count: { spent: 500n, held: 100n } }],
        windows: [],
        quote: 100n,
        wanted: 4,
      }),
    ).toEqual({ budget: 200n });
    expect(leaseSize({ budgets: [], windows: [{ window, used: 2 }], wanted: 8 })).toEqual({ requests: 4 });
  });

  it("grants nothing when half of what is left does not cover one request", () => {
    expect(
      leaseSize({
        budgets: [{ check, count: { spent: 801n, held: 0n } }],
        windows: [],
        quote: 100n,
        wanted: 4,
      }),
    ).toBeUndefined();
    expect(leaseSize({ budgets: [], windows: [{ window, used: 9 }], wanted: 4 })).toBeUndefined();
  });
});

describe("acquireLease", () => {
  it("holds the lease against the budget, and the return gives back all but what was committed", async () => {
    const { verdict, lease } = await acquireLease(deps, request(KEY), 8, NOW);
    expect(verdict).toMatchObject({ accountId: "acme", connectionId: "capped", model: "m", quote: 250n });
    // 8 requests of 250, under half of 10 000: all of it, and the budget says what is left after it.
    expect(lease?.budget).toBe(2_000n);
    expect(verdict.budgetRemaining).toBe(8_000n);
    expect(await budgetLeft()).toBe(8_000n);
    // Three requests ran: 100 charged by metering, 120 still to be charged.
    await deps.ledger.settle(`${lease!.leaseId}~1`, 100n, "evt_1", NOW);
    const back = await returnLease(
      deps.ledger,
      lease!.leaseId,
      { committed: 220n, unusedRequests: 0, unusedTokens: 0, unsure: [] },
      NOW,
    );
    expect(back.released).toBe(1_780n);
    expect(await budgetLeft()).toBe(10_000n - 220n);
    await deps.ledger.settle(`${lease!.leaseId}~2`, 120n, "evt_2", NOW);
    expect(await budgetLeft()).toBe(10_000n - 220n);
  });

  it("refuses a revoked key exactly as authorize does, taking nothing", async () => {
    await deps.store.revokeKey("k1", NOW);
    const [byAuthorize, byLease] = await Promise.all(
      [authorize(deps, request(KEY), NOW), acquireLease(deps, request(KEY), 4, NOW)].map((p) =>
        p.then(
          () => undefined,
          (e: unknown) => e,
        ),
      ),
    );
    expect(byLease).toBeInstanceOf(AuthError);
    expect(byLease).toEqual(byAuthorize);
  });

  it("grants no lease near the end of a budget: the last requests are authorized one by one", async () => {
    // 9 600 spent: 400 left, half of it does not cover a quote of 250, the whole of it does.
    const first = await authorize(
      deps,
      request(KEY, { bodyBytes: 9_400, messageCount: 2, maxOutputTokens: 168 }),
      NOW,
    );
    expect(first.quote).toBe(9_600n);
    await deps.ledger.settle(first.reservationId!, 9_600n, "evt_big", NOW);
    expect((await acquireLease(deps, request(KEY), 4, NOW)).lease).toBeUndefined();
    expect((await authorize(deps, request(KEY), NOW)).budgetRemaining).toBe(150n);
  });

  it("takes rate-limit units for the lease and gives the unused back", async () => {
    const { verdict, lease } = await acquireLease(
      deps,
      request(LIMITED, { maxOutputTokens: undefined }),
      4,
      NOW,
    );
    expect(lease).toMatchObject({ requests: 4 });
    expect(verdict.rateLimit).toMatchObject({ limit: 10, remaining: 6 });
    await returnLease(
      deps.ledger,
      lease!.leaseId,
      { committed: 0n, unusedRequests: 3, unusedTokens: 0, unsure: [] },
      NOW,
    );
    const next = await authorize(deps, request(LIMITED, { maxOutputTokens: undefined }), NOW);
    expect(next.rateLimit).toMatchObject({ limit: 10, remaining: 8 });
  });

  it("settles the requests of a lease with no budget at their cost, none of them over a hold", async () => {
    const overs: OverHold[] = [];
    deps = { ...deps, ledger: createMemoryLedger({ onOverHold: (o) => overs.push(o) }) };
    const { lease } = await acquireLease(deps, request(LIMITED, { maxOutputTokens: undefined }), 5, NOW);
    expect(lease).toMatchObject({ requests: 5 });
    expect(lease?.budget).toBeUndefined();
    for (let n = 1; n <= 5; n++) {
      const s = await deps.ledger.settle(`${lease!.leaseId}~${n}`, 4n, `evt_${n}`, NOW);
      expect(s).toEqual({ outcome: "settled", cost: 4n });
    }
    expect(overs).toEqual([]);
    // On the same ledger, a ticket above what a budgeted lease reserved is still told.
    const capped = await acquireLease(deps, request(KEY), 1, NOW);
    expect(capped.lease?.budget).toBe(250n);
    const over = await deps.ledger.settle(`${capped.lease!.leaseId}~1`, 300n, "evt_over", NOW);
    expect(over).toEqual({ outcome: "settled", cost: 250n, uncharged: 50n });
    expect(overs).toMatchObject([{ kind: "lease", asked: 300n, charged: 250n }]);
  });

  it("needs no lease id where neither a budget nor a window applies", async () => {
    const { lease } = await acquireLease(deps, request(FREE), 4, NOW);
    expect(lease).toEqual({ leaseId: "" });
  });
});
