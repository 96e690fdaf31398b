import { parseGatewayConfig } from "@tollgate/config";
import { beforeEach, describe, expect, it } from "vitest";
import { createMemoryKeyStore } from "../adapters/memory-key-store.js";
import { createMemoryLedger } from "../adapters/memory-ledger.js";
import { type AuthorizeDeps, type AuthorizeInput, authorize } from "./authorize.js";
import {
  decodeBudget,
  encodeBudget,
  isReservationId,
  newReservationId,
  periodAt,
  settleReservation,
} from "./budget.js";
import { AuthError } from "./errors.js";
import { importConfig } from "./import-config.js";

const at = (iso: string) => new Date(iso);
const iso = (ms: number) => new Date(ms).toISOString();

describe("periodAt", () => {
  it("turns the calendar month over at 00:00 UTC on the 1st, across years and leap days", () => {
    const jan = periodAt("month", at("2025-01-31T23:59:59.999Z"));
    expect(jan.tag).toBe("month:2025-01");
    expect([iso(jan.startMs), iso(jan.endMs)]).toEqual([
      "2025-01-01T00:00:00.000Z",
      "2025-02-01T00:00:00.000Z",
    ]);
    expect(periodAt("month", at("2025-02-01T00:00:00.000Z")).tag).toBe("month:2025-02");
    const dec = periodAt("month", at("2024-12-31T23:59:59.999Z"));
    expect([dec.tag, iso(dec.endMs)]).toEqual(["month:2024-12", "2025-01-01T00:00:00.000Z"]);
    expect(iso(periodAt("month", at("2024-02-29T12:00:00Z")).endMs)).toBe("2024-03-01T00:00:00.000Z");
    // A time zone ahead of UTC is already in March; the budget is not.
    expect(periodAt("month", at("2025-03-01T00:30:00+01:00")).tag).toBe("month:2025-02");
  });

  it("starts weeks on Monday, days at midnight and N-day periods from the epoch, all UTC", () => {
    // 2025-06-01 is a Sunday: its week began on Monday 2025-05-26.
    const week = periodAt("week", at("2025-06-01T23:59:59Z"));
    expect([week.tag, iso(week.endMs)]).toEqual(["week:2025-05-26", "2025-06-02T00:00:00.000Z"]);
    expect(periodAt("week", at("2025-06-02T00:00:00Z")).tag).toBe("week:2025-06-02");
    expect(periodAt("day", at("2025-06-01T23:59:59.999Z")).tag).toBe("day:2025-06-01");
    const thirty = periodAt({ days: 30 }, at("2025-06-01T12:00:00Z"));
    expect(thirty.endMs - thirty.startMs).toBe(30 * 86_400_000);
    expect((thirty.startMs / 86_400_000) % 30).toBe(0);
    expect(thirty.tag).toBe(`days-30:${iso(thirty.startMs).slice(0, 10)}`);
  });
});

describe("budget codecs and reservation ids", () => {
  it("round-trips budgets exactly and refuses anything else", () => {
    for (const b of [
      { amount: 9_007_199_254_740_991n, period: "month" as const },
      { amount: 0n, period: { days: 366 } },
    ]) {
      expect(decodeBudget(encodeBudget(b))).toEqual(b);
    }
    for (const bad of ["", "1|year", "-1|day", "1|days:0", "1|days:367", "01|day", "x"]) {
      expect(decodeBudget(bad), bad).toBeUndefined();
    }
  });

  it("names reservations with their account's hash tag", () => {
    const id = newReservationId("acme.eu:1");
    expect(id).toMatch(/^rsv_[0-9A-Za-z]{20}_\{acme\.eu:1\}$/);
    expect(isReservationId(id)).toBe(true);
    expect(isReservationId("rsv_short_{a}")).toBe(false);
  });
});

// 1 base unit per input and per output token: a quote is bodyBytes + 8 × messages + 16 + cap.
const pricing = { inputPerMillion: 1_000_000, outputPerMillion: 1_000_000 };
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
          budget: { amount: 1_000 },
          keys: [
            { id: "k1", secret: "tg_test_budget_key_one_000000" },
            { id: "k2", secret: "tg_test_budget_key_two_000000", budget: { amount: 300, period: "day" } },
          ],
        },
        {
          id: "limited",
          models: ["m"],
          defaultModel: "m",
          budget: { amount: 10_000, period: "week" },
          limits: { keyRequestsPerMinute: 2 },
          policy: { maxOutputTokens: 9_000 },
          keys: [{ id: "k3", secret: "tg_test_budget_key_three_0000" }],
        },
        {
          id: "free",
          models: ["m"],
          defaultModel: "m",
          keys: [{ id: "k4", secret: "tg_test_budget_key_four_00000" }],
        },
      ],
    },
  ],
});
const K1 = "tg_test_budget_key_one_000000";
const K2 = "tg_test_budget_key_two_000000";
const K3 = "tg_test_budget_key_three_0000";
const K4 = "tg_test_budget_key_four_00000";

const NOW = at("2025-06-10T12:00:00Z");
const after = (s: number, from = NOW) => new Date(from.getTime() + s * 1_000);

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
const ask = (key: string, now = NOW, input: Partial<AuthorizeInput> = {}) =>
  authorize(
    deps,
    { key, model: "", route: "chat", bodyBytes: 84, messageCount: 2, maxOutputTokens: 134, ...input },
    now,
  );
const models = (key: string, now = NOW) => authorize(deps, { key, model: "", route: "models" }, now);

async function refusal(p: Promise<unknown>): Promise<AuthError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AuthError);
  return err as AuthError;
}

describe("authorize: budgets", () => {
  it("quotes the request, holds it and reports what is left", async () => {
    const a = await ask(K1);
    expect(a.quote).toBe(250n);
    expect(isReservationId(a.reservationId ?? "")).toBe(true);
    expect(a.reservationId).toContain("{acme}");
    expect(a.budgetRemaining).toBe(750n);
    expect(a.keyBudgetRemaining).toBeUndefined();
    // No budget on the connection: a quote but no reservation.
    const free = await ask(K4);
    expect(free).toMatchObject({ quote: 250n });
    expect(free.reservationId).toBeUndefined();
    expect(free.budgetRemaining).toBeUndefined();
  });

  it("admits exactly what fits and refuses the next request with 402 numbers", async () => {
    for (let i = 0; i < 4; i++) expect((await ask(K1)).budgetRemaining).toBe(BigInt(750 - 250 * i));
    const err = await refusal(ask(K1));
    expect(err.code).toBe("budget_exceeded");
    // June 10 12:00 → July 1 00:00 is 20.5 days.
    expect(err.budget).toEqual({
      scope: "connection",
      limit: 1_000n,
      remaining: 0n,
      quote: 250n,
      resetSeconds: 20.5 * 86_400,
    });
    expect(err.message).toContain("250");
    // Even the smallest request is refused once nothing is left.
    expect((await refusal(ask(K1, NOW, { maxOutputTokens: 1 }))).code).toBe("budget_exceeded");
  });

  it("never holds anything on the models route, and shows the budget there even when it is spent", async () => {
    for (let i = 0; i < 4; i++) await ask(K1);
    const m = await models(K1);
    expect(m.reservationId).toBeUndefined();
    expect(m.quote).toBeUndefined();
    expect(m.budgetRemaining).toBe(0n);
    expect((await models(K2)).keyBudgetRemaining).toBe(300n);
  });

  it("settles the actual cost in place of the quote, once", async () => {
    const first = await ask(K1);
    await ask(K1);
    const settled = await settleReservation(
      deps.ledger,
      { reservationId: first.reservationId!, cost: 100n, eventId: "evt_1" },
      after(5),
    );
    expect(settled).toEqual({ outcome: "settled", cost: 100n });
    // 100 spent + 250 held.
    expect((await models(K1, after(6))).budgetRemaining).toBe(650n);
    const again = await settleReservation(
      deps.ledger,
      { reservationId: first.reservationId!, cost: 100n, eventId: "evt_1" },
      after(7),
    );
    expect(again.outcome).toBe("already_settled");
    expect((await models(K1, after(8))).budgetRemaining).toBe(650n);
    await expect(
      settleReservation(deps.ledger, { reservationId: "", cost: 1n, eventId: "e" }, after(9)),
    ).rejects.toMatchObject({ code: "invalid_argument" });
  });

  it("frees an unused hold after the reservation TTL (600 s) and still counts late usage", async () => {
    const held = await ask(K1);
    for (let i = 0; i < 3; i++) await ask(K1);
    expect((await refusal(ask(K1, after(599)))).code).toBe("budget_exceeded");
    // The four holds were taken at NOW; at NOW + 600 s they no longer count.
    expect((await ask(K1, after(600))).budgetRemaining).toBe(750n);
    const late = await settleReservation(
      deps.ledger,
      { reservationId: held.reservationId!, cost: 200n, eventId: "evt_late" },
      after(700),
    );
    expect(late.outcome).toBe("settled_after_expiry");
    expect((await models(K1, after(701))).budgetRemaining).toBe(550n);
  });

  it("starts a fresh month at 00:00 UTC on the 1st and settles into the month a request was made in", async () => {
    const lastSecond = at("2025-06-30T23:59:59Z");
    const june: string[] = [];
    for (let i = 0; i < 4; i++) june.push((await ask(K1, lastSecond)).reservationId!);
    expect((await refusal(ask(K1, at("2025-06-30T23:59:59.999Z")))).code).toBe("budget_exceeded");
    const july = await ask(K1, at("2025-07-01T00:00:00Z"));
    expect(july.budgetRemaining).toBe(750n);
    // June's usage arrives in July: it is June's spend, July is untouched.
    for (const id of june) {
      await settleReservation(
        deps.ledger,
        { reservationId: id, cost: 10n, eventId: id },
        at("2025-07-01T00:00:01Z"),
      );
    }
    expect((await models(K1, at("2025-07-01T00:00:02Z"))).budgetRemaining).toBe(750n);
    expect((await models(K1, at("2025-06-30T23:59:59.5Z"))).budgetRemaining).toBe(960n);
  });

  it("applies a key's own budget on top of its connection's", async () => {
    const a = await ask(K2);
    expect([a.budgetRemaining, a.keyBudgetRemaining]).toEqual([750n, 50n]);
    const err = await refusal(ask(K2));
    expect(err.budget).toMatchObject({ scope: "key", limit: 300n, remaining: 50n, quote: 250n });
    // The key's refusal held nothing on the connection: K1 still gets the 750 left.
    for (let i = 0; i < 3; i++) await ask(K1);
    expect((await refusal(ask(K1))).budget).toMatchObject({ scope: "connection", remaining: 0n });
    // A day budget turns over at midnight UTC, the connection's month does not.
    await settleReservation(
      deps.ledger,
      { reservationId: a.reservationId!, cost: 250n, eventId: "e" },
      after(1),
    );
    const tomorrow = await models(K2, at("2025-06-11T00:00:00Z"));
    expect([tomorrow.budgetRemaining, tomorrow.keyBudgetRemaining]).toEqual([750n, 300n]);
  });

  it("counts no rate-limit unit for a budget refusal, and holds nothing for a rate-limit refusal", async () => {
    // 10 000 per week, 2 requests per minute for the key.
    const big = { maxOutputTokens: 9_000 };
    await ask(K3, NOW, big);
    expect((await refusal(ask(K3, after(1), big))).code).toBe("budget_exceeded");
    // The refusal did not use the key's second request of the minute.
    const second = await ask(K3, after(2));
    expect(second.budgetRemaining).toBe(10_000n - 9_116n - 250n);
    expect((await refusal(ask(K3, after(3)))).code).toBe("rate_limited");
    // (The models route counts as a request too: look a minute later, the holds still live.)
    expect((await models(K3, after(61))).budgetRemaining).toBe(10_000n - 9_116n - 250n);
  });

  it("quotes from 4 bytes per estimated input token when the caller sent no body size", async () => {
    // 100 tokens → 400 bytes, and as many messages as bytes: 400 + 8 × 400 + 16 + 134.
    const a = await authorize(
      deps,
      { key: K4, model: "", route: "chat", estimatedInputTokens: 100, maxOutputTokens: 134 },
      NOW,
    );
    expect(a.quote).toBe(BigInt(400 + 3_200 + 16 + 134));
  });
});
